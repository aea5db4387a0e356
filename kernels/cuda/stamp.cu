/* stamp.cu — the extern "C" kernels of the typed templates.
 *
 * Each kernel of an element type is one template in the .cu files
 * (template <typename T> KC_DEV void k_softmax_rows(...)).  kernels.def,
 * which comes right after this file in the device program, lists them in
 * KC_TYPED_ROWS and expands the list for float (S _f32) and double (S
 * _f64): here each row becomes the kernel the runtime looks up by name,
 * name##S, whose body calls the template (T deduced from the arguments).
 * The dtype-generic rows (KC) are defined in the .cu files as they are.
 */
#define KC(name, params)
#define KC_TYPED(name, S, params)                                                                          \
    KC_GLOBAL void name##S(KC_PARAMS params) { name(KC_NAMES params); }

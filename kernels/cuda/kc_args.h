/* kc_args.h — a kernels.def row's parameter list, (T0, T1, ...), made
 * into C text by the preprocessor, for the two places that write a function
 * per row: launch.c (each kernel's typed launch, which hands kc_launch the
 * arguments' addresses) and stamp.cu (each typed kernel's extern "C"
 * instances, which call its template).  Plain macros, no includes: it is C
 * for launch.c and part of the device program for NVRTC.  Up to 16
 * parameters.
 *   KC_PARAMS(T0, T1, ...)    T0 a0, T1 a1, ...
 *   KC_NAMES(T0, T1, ...)     a0, a1, ...
 *   KC_ARGS(T0, T1, ...)      &a0, &a1, ...
 */
#ifndef FSDPC_KC_ARGS_H
#define FSDPC_KC_ARGS_H

#define KC_NARG(...) KC_NARG_(__VA_ARGS__, 16, 15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0)
#define KC_NARG_(a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15, a16, n, ...) n
#define KC_CAT(a, b) KC_CAT_(a, b)
#define KC_CAT_(a, b) a##b
/* (T0, T1, ...) -> "T0 a0, T1 a1, ..." and "&a0, &a1, ..." */
#define KC_P1(t) t a0
#define KC_P2(t0, t) KC_P1(t0), t a1
#define KC_P3(t0, t1, t) KC_P2(t0, t1), t a2
#define KC_P4(t0, t1, t2, t) KC_P3(t0, t1, t2), t a3
#define KC_P5(t0, t1, t2, t3, t) KC_P4(t0, t1, t2, t3), t a4
#define KC_P6(t0, t1, t2, t3, t4, t) KC_P5(t0, t1, t2, t3, t4), t a5
#define KC_P7(t0, t1, t2, t3, t4, t5, t) KC_P6(t0, t1, t2, t3, t4, t5), t a6
#define KC_P8(t0, t1, t2, t3, t4, t5, t6, t) KC_P7(t0, t1, t2, t3, t4, t5, t6), t a7
#define KC_P9(t0, t1, t2, t3, t4, t5, t6, t7, t) KC_P8(t0, t1, t2, t3, t4, t5, t6, t7), t a8
#define KC_P10(t0, t1, t2, t3, t4, t5, t6, t7, t8, t) KC_P9(t0, t1, t2, t3, t4, t5, t6, t7, t8), t a9
#define KC_P11(t0, t1, t2, t3, t4, t5, t6, t7, t8, t9, t)                                           \
    KC_P10(t0, t1, t2, t3, t4, t5, t6, t7, t8, t9), t a10
#define KC_P12(t0, t1, t2, t3, t4, t5, t6, t7, t8, t9, t10, t)                                      \
    KC_P11(t0, t1, t2, t3, t4, t5, t6, t7, t8, t9, t10), t a11
#define KC_P13(t0, t1, t2, t3, t4, t5, t6, t7, t8, t9, t10, t11, t)                                 \
    KC_P12(t0, t1, t2, t3, t4, t5, t6, t7, t8, t9, t10, t11), t a12
#define KC_P14(t0, t1, t2, t3, t4, t5, t6, t7, t8, t9, t10, t11, t12, t)                            \
    KC_P13(t0, t1, t2, t3, t4, t5, t6, t7, t8, t9, t10, t11, t12), t a13
#define KC_P15(t0, t1, t2, t3, t4, t5, t6, t7, t8, t9, t10, t11, t12, t13, t)                       \
    KC_P14(t0, t1, t2, t3, t4, t5, t6, t7, t8, t9, t10, t11, t12, t13), t a14
#define KC_P16(t0, t1, t2, t3, t4, t5, t6, t7, t8, t9, t10, t11, t12, t13, t14, t)                  \
    KC_P15(t0, t1, t2, t3, t4, t5, t6, t7, t8, t9, t10, t11, t12, t13, t14), t a15
#define KC_N1 a0
#define KC_N2 KC_N1, a1
#define KC_N3 KC_N2, a2
#define KC_N4 KC_N3, a3
#define KC_N5 KC_N4, a4
#define KC_N6 KC_N5, a5
#define KC_N7 KC_N6, a6
#define KC_N8 KC_N7, a7
#define KC_N9 KC_N8, a8
#define KC_N10 KC_N9, a9
#define KC_N11 KC_N10, a10
#define KC_N12 KC_N11, a11
#define KC_N13 KC_N12, a12
#define KC_N14 KC_N13, a13
#define KC_N15 KC_N14, a14
#define KC_N16 KC_N15, a15
#define KC_A1 &a0
#define KC_A2 KC_A1, &a1
#define KC_A3 KC_A2, &a2
#define KC_A4 KC_A3, &a3
#define KC_A5 KC_A4, &a4
#define KC_A6 KC_A5, &a5
#define KC_A7 KC_A6, &a6
#define KC_A8 KC_A7, &a7
#define KC_A9 KC_A8, &a8
#define KC_A10 KC_A9, &a9
#define KC_A11 KC_A10, &a10
#define KC_A12 KC_A11, &a11
#define KC_A13 KC_A12, &a12
#define KC_A14 KC_A13, &a13
#define KC_A15 KC_A14, &a14
#define KC_A16 KC_A15, &a15
#define KC_NAMES(...) KC_CAT(KC_N, KC_NARG(__VA_ARGS__))
#define KC_PARAMS(...) KC_CAT(KC_P, KC_NARG(__VA_ARGS__))(__VA_ARGS__)
#define KC_ARGS(...) KC_CAT(KC_A, KC_NARG(__VA_ARGS__))

#endif

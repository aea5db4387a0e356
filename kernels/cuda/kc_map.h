/* kc_map.h — the kernels.h API on the cuda target.
 *
 * Every kernels.h function that the generated step calls with float32,
 * float64, bfloat16 (k_matmul_bf16, k_matmul_add_bf16, k_attention_bf16, k_attention_grad_bf16), float16 (k_matmul_f16,
 * k_matmul_add_f16, k_attention_f16, k_attention_grad_f16) or dtype-generic arguments has a twin in
 * kernels/cuda/launch.c named kc_ instead of k_, with the same parameters
 * and contract (pointers are device pointers).  This header maps each k_
 * name to its twin and then includes kernels.h, so kernels.h's own
 * declarations become the twins' prototypes: the two APIs cannot drift
 * apart.  The generated step (codegen/exe.c on the cuda target) and
 * launch.c include it before anything else includes kernels.h.
 *
 * Every float32 kernel has its float64 twin but the loss-scaling ones
 * (k_loss_seed_f32, k_unscale_sq_f32: --precision fp16 only).
 * Not twinned: k_accum_strided (no emitter calls it), and the host helpers
 * k_pool_out_dim, k_conv2d_workspace and k_philox4x32_10, which the step
 * never calls (codegen evaluates the first two at compile time), and the
 * scalar k_bf16_from_f32 / k_bf16_to_f32 / k_f16_from_f32 / k_f16_to_f32
 * (tensors convert with k_cast), and the single GEMMs k_gemm_bf16 /
 * k_gemm_widened_16 (the cpu attention's; cuBLASLt has its own).
 */
#ifndef FSDPC_KC_MAP_H
#define FSDPC_KC_MAP_H

#ifdef FSDPC_KERNELS_H
#error "include kc_map.h before kernels.h: it renames kernels.h's declarations"
#endif

/* attn.c */
#define k_attention_f32 kc_attention_f32
#define k_attention_f64 kc_attention_f64
#define k_attention_grad_f32 kc_attention_grad_f32
#define k_attention_grad_f64 kc_attention_grad_f64
#define k_attention_bf16 kc_attention_bf16
#define k_attention_f16 kc_attention_f16
#define k_attention_grad_bf16 kc_attention_grad_bf16
#define k_attention_grad_f16 kc_attention_grad_f16
/* ew.c */
#define k_binary_f32 kc_binary_f32
#define k_binary_f64 kc_binary_f64
#define k_binary_i64 kc_binary_i64
#define k_unary_f32 kc_unary_f32
#define k_unary_f64 kc_unary_f64
#define k_unary_grad_f32 kc_unary_grad_f32
#define k_unary_grad_f64 kc_unary_grad_f64
#define k_scale_f32 kc_scale_f32
#define k_scale_f64 kc_scale_f64
#define k_fill_f32 kc_fill_f32
#define k_fill_f64 kc_fill_f64
#define k_compare_f32 kc_compare_f32
#define k_compare_f64 kc_compare_f64
#define k_compare_i64 kc_compare_i64
#define k_where_grad_f32 kc_where_grad_f32
#define k_where_grad_f64 kc_where_grad_f64
#define k_not kc_not
#define k_cast kc_cast
#define k_where kc_where
/* copy.c */
#define k_copy_strided kc_copy_strided
#define k_transpose_f32 kc_transpose_f32
#define k_transpose_f64 kc_transpose_f64
#define k_pad_f32 kc_pad_f32
#define k_pad_f64 kc_pad_f64
#define k_pad_grad_f32 kc_pad_grad_f32
#define k_pad_grad_f64 kc_pad_grad_f64
/* matmul.c */
#define k_matmul_f32 kc_matmul_f32
#define k_matmul_f64 kc_matmul_f64
#define k_matmul_bf16 kc_matmul_bf16
#define k_matmul_f16 kc_matmul_f16
#define k_matmul_add_f32 kc_matmul_add_f32
#define k_matmul_add_f64 kc_matmul_add_f64
#define k_matmul_add_bf16 kc_matmul_add_bf16
#define k_matmul_add_f16 kc_matmul_add_f16
/* reduce.c */
#define k_reduce_sum_to_f32 kc_reduce_sum_to_f32
#define k_reduce_sum_to_f64 kc_reduce_sum_to_f64
#define k_reduce_f32 kc_reduce_f32
#define k_reduce_f64 kc_reduce_f64
#define k_reduce_max_grad_f32 kc_reduce_max_grad_f32
#define k_reduce_max_grad_f64 kc_reduce_max_grad_f64
#define k_reduce_prod_grad_f32 kc_reduce_prod_grad_f32
#define k_reduce_prod_grad_f64 kc_reduce_prod_grad_f64
#define k_softmax_f32 kc_softmax_f32
#define k_softmax_f64 kc_softmax_f64
#define k_softmax_grad_f32 kc_softmax_grad_f32
#define k_softmax_grad_f64 kc_softmax_grad_f64
#define k_range_f32 kc_range_f32
#define k_range_f64 kc_range_f64
#define k_range_i64 kc_range_i64
#define k_trilu kc_trilu
/* norm.c */
#define k_layernorm_f32 kc_layernorm_f32
#define k_layernorm_f64 kc_layernorm_f64
#define k_layernorm_grad_f32 kc_layernorm_grad_f32
#define k_layernorm_grad_f64 kc_layernorm_grad_f64
#define k_batchnorm_train_f32 kc_batchnorm_train_f32
#define k_batchnorm_train_f64 kc_batchnorm_train_f64
#define k_batchnorm_grad_f32 kc_batchnorm_grad_f32
#define k_batchnorm_grad_f64 kc_batchnorm_grad_f64
#define k_batchnorm_infer_f32 kc_batchnorm_infer_f32
#define k_batchnorm_infer_f64 kc_batchnorm_infer_f64
#define k_bn_running_var_f32 kc_bn_running_var_f32
#define k_bn_running_var_f64 kc_bn_running_var_f64
/* conv.c */
#define k_conv2d_f32 kc_conv2d_f32
#define k_conv2d_f64 kc_conv2d_f64
#define k_conv2d_grad_x_f32 kc_conv2d_grad_x_f32
#define k_conv2d_grad_x_f64 kc_conv2d_grad_x_f64
#define k_conv2d_grad_w_f32 kc_conv2d_grad_w_f32
#define k_conv2d_grad_w_f64 kc_conv2d_grad_w_f64
#define k_conv2d_grad_b_f32 kc_conv2d_grad_b_f32
#define k_conv2d_grad_b_f64 kc_conv2d_grad_b_f64
#define k_maxpool2d_f32 kc_maxpool2d_f32
#define k_maxpool2d_f64 kc_maxpool2d_f64
#define k_maxpool2d_grad_f32 kc_maxpool2d_grad_f32
#define k_maxpool2d_grad_f64 kc_maxpool2d_grad_f64
#define k_avgpool2d_f32 kc_avgpool2d_f32
#define k_avgpool2d_f64 kc_avgpool2d_f64
#define k_avgpool2d_grad_f32 kc_avgpool2d_grad_f32
#define k_avgpool2d_grad_f64 kc_avgpool2d_grad_f64
#define k_global_avgpool_f32 kc_global_avgpool_f32
#define k_global_avgpool_f64 kc_global_avgpool_f64
#define k_global_avgpool_grad_f32 kc_global_avgpool_grad_f32
#define k_global_avgpool_grad_f64 kc_global_avgpool_grad_f64
/* gather.c */
#define k_gather kc_gather
#define k_gather_grad_f32 kc_gather_grad_f32
#define k_gather_grad_f64 kc_gather_grad_f64
#define k_gather_elements kc_gather_elements
#define k_gather_elements_grad_f32 kc_gather_elements_grad_f32
#define k_gather_elements_grad_f64 kc_gather_elements_grad_f64
#define k_nd_index kc_nd_index
/* random.c */
#define k_dropout_f32 kc_dropout_f32
#define k_dropout_f64 kc_dropout_f64
#define k_dropout_grad_f32 kc_dropout_grad_f32
#define k_dropout_grad_f64 kc_dropout_grad_f64
/* loss.c */
#define k_mse_f32 kc_mse_f32
#define k_mse_f64 kc_mse_f64
#define k_mse_grad_f32 kc_mse_grad_f32
#define k_mse_grad_f64 kc_mse_grad_f64
#define k_cross_entropy_f32 kc_cross_entropy_f32
#define k_cross_entropy_f64 kc_cross_entropy_f64
#define k_cross_entropy_grad_f32 kc_cross_entropy_grad_f32
#define k_cross_entropy_grad_f64 kc_cross_entropy_grad_f64
#define k_cross_entropy_bf16 kc_cross_entropy_bf16
#define k_cross_entropy_f16 kc_cross_entropy_f16
#define k_cross_entropy_grad_bf16 kc_cross_entropy_grad_bf16
#define k_cross_entropy_grad_f16 kc_cross_entropy_grad_f16
#define k_nll_loss_f32 kc_nll_loss_f32
#define k_nll_loss_f64 kc_nll_loss_f64
#define k_nll_loss_grad_f32 kc_nll_loss_grad_f32
#define k_nll_loss_grad_f64 kc_nll_loss_grad_f64
/* optim.c */
#define k_adamw_f32 kc_adamw_f32
#define k_adamw_f64 kc_adamw_f64
#define k_sgd_f32 kc_sgd_f32
#define k_sgd_f64 kc_sgd_f64
#define k_sum_squares_f32 kc_sum_squares_f32
#define k_sum_squares_f64 kc_sum_squares_f64
#define k_grad_accum_f32 kc_grad_accum_f32
#define k_grad_accum_f64 kc_grad_accum_f64
#define k_loss_seed_f32 kc_loss_seed_f32
#define k_unscale_sq_f32 kc_unscale_sq_f32
#define k_nan_unless_finite kc_nan_unless_finite

#include "kernels.h"
#include "kc.h"

#endif

# kernels/cuda: owned by the kernels/cuda work (see kc.h)

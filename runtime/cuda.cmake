# the cuda runtime library (fsdpc_rt_cuda): see rt_dev.h, rt_ctl.h

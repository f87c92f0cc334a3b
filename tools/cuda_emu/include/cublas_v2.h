// The CUDA header as the host emulation (tools/cuda_emu) provides it.
#include "../cuda_emu.h"

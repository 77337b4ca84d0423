// CUstream without <cuda.h>: the same declaration the driver API makes, so that a stream from the
// CUDA runtime (cudaStream_t), from PyTorch or from cuda.h passes straight in, and kjit's headers
// need no CUDA toolkit to be included. nullptr is the legacy default stream.
#pragma once

typedef struct CUstream_st* CUstream;  // NOLINT: must match cuda.h's spelling exactly

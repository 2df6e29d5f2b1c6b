// Plain-C++ description of one tk::matmul call, shared by the torch op (matmul_ops.cpp)
// and the kernel file, which must not include torch headers.
#pragma once
#include <cstdint>
#include <cuda_runtime.h>

namespace tk::matmul {

enum class ElementType { bf16, fp16 };

// One operand as a batch of matrices. Exactly one of the two matrix dims is contiguous:
// `transposed` false means row-major (stride 1 along cols), true means column-major (stride
// 1 along rows, i.e. the transpose of a row-major matrix). The other strides are multiples
// of 8 elements (16 bytes, what TMA needs) and `data` is 16-byte aligned.
struct Operand {
    const void* data;
    int batch;              // 1 (broadcast over the output batch) or the output batch
    bool transposed;
    int64_t batch_stride;   // elements
    int64_t leading_stride; // elements between rows (row-major) or columns (column-major)
};

struct MatmulParams {
    Operand a;  // (batch, M, K)
    Operand b;  // (batch, K, N)
    void* c;    // (batch, M, N) contiguous, the inputs' dtype
    int batch, m, n, k;
    ElementType dtype;
    int multiprocessors;  // of the current device (torch's cached properties)
    int64_t l2_bytes;     // the device's L2 cache
};

// TMA + wgmma kernel (sm_90a). Returns the first CUDA error (launch, tensor-map encoding
// reported as cudaErrorInvalidValue).
cudaError_t matmul_sm90(const MatmulParams& params, cudaStream_t stream);

}  // namespace tk::matmul

// Helpers shared by the Hopper core test kernels.
#pragma once
#include <string>

#include "common.cuh"
#include "kittens/hopper/hopper.cuh"
#include "hopper_launchers.h"

namespace tk_test {

// Tensor map for ST-shaped TMA copies of g; a refusal (e.g. strides that are not
// multiples of 16 bytes) becomes a Python RuntimeError.
template <typename ST, typename T>
CUtensorMap tensor_map(const gl<T>& g) {
    CUtensorMap map;
    const CUresult r = tma::make_tensor_map<ST>(&map, g);
    if (r != CUDA_SUCCESS) throw std::runtime_error("make_tensor_map failed: CUresult " + std::to_string(int(r)));
    return map;
}

}  // namespace tk_test

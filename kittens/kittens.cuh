// The tile core: include this one header.
//   common/  element types, index math (host-testable), device helpers, launch helpers
//   types/   register tiles/vectors, shared tiles/vectors, global layouts
//   ops/     destination-first tile ops: maps, reductions, conversions, mma,
//            memory movement; group<N> collaborative copies (cp.async)
#pragma once
#include "common/base_types.cuh"
#include "common/util.cuh"
#include "common/launch.cuh"
#include "types/types.cuh"
#include "ops/ops.cuh"

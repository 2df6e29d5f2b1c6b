// The Hopper (sm_90a) layer of the core: mbarrier semaphores, thread-block clusters,
// TMA tile copies (multicast too) and wgmma. Device functions here may only be
// instantiated in code compiled for sm_90a.
#pragma once
#include "semaphore.cuh"
#include "cluster.cuh"
#include "tma.cuh"
#include "wgmma.cuh"
#include "pipeline.cuh"

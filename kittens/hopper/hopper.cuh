// The Hopper (sm_90a) layer of the core: mbarrier semaphores, block clusters, TMA tile
// copies and wgmma. Device functions here may only be instantiated in code compiled for sm_90a.
#pragma once
#include "semaphore.cuh"
#include "cluster.cuh"
#include "tma.cuh"
#include "wgmma.cuh"
#include "pipeline.cuh"
#include "ordered_reduce.cuh"

#pragma once
#include "register/rt.cuh"
#include "register/rv.cuh"
#include "shared/st.cuh"
#include "shared/sv.cuh"
#include "global/gl.cuh"

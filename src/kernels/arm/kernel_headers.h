// Every header the Arm kernel sources use, included by each level's .cpp
// BEFORE its target region opens, so no inline function of a shared header
// (the standard library's, the engine's) is compiled for the level's ISA and
// then picked by the linker for every caller.
#pragma once

#include <arm_neon.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <type_traits>
#include <vector>

#include "core/allocator.h"
#include "kernels/activation.h"
#include "kernels/dispatch.h"
#include "kernels/grouped_gemm_internal.h"
#include "moe/config.h"
#include "moe/dtype.h"
#include "moe/error.h"
#include "moe/isa.h"
#include "moe/tensor.h"
#include "moe/thread_pool.h"

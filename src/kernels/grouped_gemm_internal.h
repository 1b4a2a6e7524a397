// Internal pieces of the grouped GEMM shared by the public entry points
// (grouped_gemm.cpp), the reference twin and the AVX-512 kernels.
#pragma once

#include <atomic>
#include <cstdint>

#include "kernels/grouped_gemm.h"

namespace moe::detail {

// Argument checks of each op; throw moe::Error naming the op.
void check_gmm(const Lhs& lhs, const Tensor& rhs, const GroupLayout& groups, int64_t group_offset,
               const Tensor& out);
void check_gmm_pair(const Lhs& lhs, const Tensor& rhs0, const Tensor& rhs1, const GroupLayout& groups,
                    int64_t group_offset, const Tensor& out);
void check_gmm_dlhs(const Tensor& dout, const Tensor& rhs, const GroupLayout& groups, int64_t group_offset,
                    const Tensor& dlhs);
void check_gmm_dlhs_add(const Tensor& dout, const Tensor& rhs, const GroupLayout& groups,
                        int64_t group_offset, const Tensor& addend, const Tensor& dlhs);
// mixed: also a bf16 lhs with an f32 dout (gmm_drhs only; gmm_drhs_acc and gmm_drhs_pair take one dtype).
void check_gmm_drhs(const Lhs& lhs, const Tensor& dout, const GroupLayout& groups, int64_t group_offset,
                    const Tensor& drhs, bool mixed = false);

// Test hook: while true, the fast levels' gmm and gmm_dlhs take the panel
// schedule (the whole reduction packed per task) whatever the shape, so tests
// can hold the weight-slab schedules to its bits (ScopedPanelSchedule).
inline std::atomic<bool> force_panel_schedule{false};

struct ScopedPanelSchedule {
  ScopedPanelSchedule() { force_panel_schedule.store(true); }
  ~ScopedPanelSchedule() { force_panel_schedule.store(false); }
  ScopedPanelSchedule(const ScopedPanelSchedule&) = delete;
  ScopedPanelSchedule& operator=(const ScopedPanelSchedule&) = delete;
};

// Test hook: while true, amx_bf16's weight gradients write each group's lhs^T out before the tiles
// run, whatever the shape, instead of the tasks transposing their own rows of lhs (tests hold the
// two to the same bits: ScopedLhsTCopy).
inline std::atomic<bool> force_lhs_t_copy{false};

struct ScopedLhsTCopy {
  ScopedLhsTCopy() { force_lhs_t_copy.store(true); }
  ~ScopedLhsTCopy() { force_lhs_t_copy.store(false); }
  ScopedLhsTCopy(const ScopedLhsTCopy&) = delete;
  ScopedLhsTCopy& operator=(const ScopedLhsTCopy&) = delete;
};

}  // namespace moe::detail

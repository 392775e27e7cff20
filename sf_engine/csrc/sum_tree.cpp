// Prioritized replay's sum tree (sf_engine/replay/sum_tree.py lays it out and keeps the NumPy version of
// these two ops): sampling a batch and setting leaves, each one call over the whole batch.
//
// Why: in NumPy each level of the tree is a handful of calls over the batch, and a learner step of the
// classic-control DQN (batch 128, an MLP of 2 x 64) is short enough that their dispatch, and the tree's
// cache misses between two steps, made prioritized replay a fifth of the step; here each draw walks its
// path down the tree in one loop.
//
// The tree is one float64 array; `offsets` and `sizes` give each level's first float and its floats, the
// leaves first and the top last. Node j of a level sums floats [FANOUT j, FANOUT (j + 1)) of the level below.
// Both ops follow the NumPy version's arithmetic step by step (running sums from the left), so over the same
// array and the same uniform draws they return the same leaves.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace {

using at::Tensor;
using i64 = int64_t;

constexpr i64 FANOUT = 16;

void check_tree(const Tensor& tree, const std::vector<i64>& offsets, const std::vector<i64>& sizes) {
  TORCH_CHECK(tree.dim() == 1 && tree.is_contiguous() && tree.scalar_type() == at::kDouble && tree.device().is_cpu(),
              "sum tree: the array must be a contiguous CPU float64 vector");
  TORCH_CHECK(!offsets.empty() && offsets.size() == sizes.size(), "sum tree: one offset and size per level");
  for (size_t l = 0; l < offsets.size(); ++l) {
    TORCH_CHECK(offsets[l] >= 0 && sizes[l] > 0 && offsets[l] + sizes[l] <= tree.size(0),
                "sum tree: level ", l, " lies outside the array");
    if (l + 1 < offsets.size())
      TORCH_CHECK(sizes[l] % FANOUT == 0 && sizes[l + 1] * FANOUT >= sizes[l],
                  "sum tree: level ", l, " must be whole nodes of the level above");
  }
}

// [B] int64 leaves drawn in proportion to priority, draw i's target at (i + uniforms[i]) * total / B; an
// empty tensor when the total is not > 0. Where rounding puts a target past a node's last child, the draw
// takes the node's last child with priority > 0, so a leaf of priority 0 is never drawn.
Tensor sum_tree_sample(Tensor tree, std::vector<i64> offsets, std::vector<i64> sizes, Tensor uniforms) {
  check_tree(tree, offsets, sizes);
  TORCH_CHECK(uniforms.dim() == 1 && uniforms.is_contiguous() && uniforms.scalar_type() == at::kDouble &&
                  uniforms.device().is_cpu() && uniforms.size(0) > 0,
              "sum tree: the uniform draws must be a non-empty contiguous CPU float64 vector");
  const double* t = tree.data_ptr<double>();
  const double* top = t + offsets.back();
  const i64 top_nodes = sizes.back(), batch = uniforms.size(0);
  std::vector<double> before(top_nodes + 1, 0.0);  // before[n]: the mass of the top nodes left of node n
  for (i64 n = 0; n < top_nodes; ++n) before[n + 1] = before[n] + top[n];
  const double total = before[top_nodes];
  if (!(total > 0)) return at::empty({0}, tree.options().dtype(at::kLong));
  i64 last_positive = top_nodes - 1;
  while (last_positive > 0 && !(top[last_positive] > 0)) --last_positive;
  const double segment = total / batch;
  const double* u = uniforms.data_ptr<double>();
  Tensor leaves = at::empty({batch}, tree.options().dtype(at::kLong));
  i64* node = leaves.data_ptr<i64>();  // each draw's node of the level it has reached, in the end its leaf
  std::vector<double> target(batch);   // the mass each draw has left to walk past among its node's children
  for (i64 i = 0; i < batch; ++i) {
    target[i] = (double(i) + u[i]) * segment;
    node[i] = std::upper_bound(before.begin() + 1, before.end(), target[i]) - (before.begin() + 1);
    if (node[i] == top_nodes) node[i] = last_positive;
    target[i] -= before[node[i]];
  }
  // level by level over the whole batch, not draw by draw: the draws' reads of a level are independent, so
  // their cache misses overlap
  for (i64 l = i64(offsets.size()) - 2; l >= 0; --l) {
    for (i64 i = 0; i < batch; ++i) {
      const double* children = t + offsets[l] + node[i] * FANOUT;
      double passed = 0.0;
      i64 c = 0;
      while (c < FANOUT && passed + children[c] <= target[i]) passed += children[c++];
      if (c == FANOUT) {  // rounding passed them all: the last child with priority > 0
        c = FANOUT - 1;
        while (c > 0 && !(children[c] > 0)) --c;
        passed = 0.0;
        for (i64 k = 0; k < c; ++k) passed += children[k];
      }
      target[i] -= passed;
      node[i] = node[i] * FANOUT + c;
    }
  }
  return leaves;
}

// Sets the leaves `indices` ([B] int64, may repeat: the last value wins) to `priorities` ([B] float64) and
// every sum above them, and raises the running max in tree[0] to the highest priority set. With `only_positive`,
// a leaf at 0 before the call keeps it (what a learner's new priorities must not revive). Returns 0; or, changing
// nothing, 1 when an index is outside [0, capacity), 2 when a priority is negative or not finite.
i64 sum_tree_update(Tensor tree, std::vector<i64> offsets, std::vector<i64> sizes, i64 capacity, Tensor indices,
                    Tensor priorities, bool only_positive) {
  check_tree(tree, offsets, sizes);
  TORCH_CHECK(capacity > 0 && capacity <= sizes[0], "sum tree: capacity ", capacity, " exceeds the leaves");
  TORCH_CHECK(indices.dim() == 1 && indices.is_contiguous() && indices.scalar_type() == at::kLong &&
                  priorities.dim() == 1 && priorities.is_contiguous() && priorities.scalar_type() == at::kDouble &&
                  indices.size(0) == priorities.size(0) && indices.device().is_cpu() && priorities.device().is_cpu(),
              "sum tree: indices (int64) and priorities (float64) must be contiguous CPU vectors of one length");
  const i64 batch = indices.size(0);
  const i64* idx = indices.data_ptr<i64>();
  const double* p = priorities.data_ptr<double>();
  for (i64 i = 0; i < batch; ++i) {
    if (idx[i] < 0 || idx[i] >= capacity) return 1;
    if (!(p[i] >= 0 && p[i] < INFINITY)) return 2;  // NaN fails both
  }
  double* t = tree.data_ptr<double>();
  double* leaves = t + offsets[0];
  std::vector<i64> changed;  // the leaves set, in order: with only_positive, those > 0 before any is set
  changed.reserve(batch);
  std::vector<double> values;
  values.reserve(batch);
  for (i64 i = 0; i < batch; ++i) {
    if (only_positive && !(leaves[idx[i]] > 0)) continue;
    changed.push_back(idx[i]);
    values.push_back(p[i]);
  }
  double highest = t[0];
  for (size_t k = 0; k < changed.size(); ++k) {
    leaves[changed[k]] = values[k];
    highest = std::max(highest, values[k]);
  }
  t[0] = highest;
  for (size_t l = 1; l < offsets.size(); ++l) {  // each level's changed nodes, once each
    for (i64& node : changed) node /= FANOUT;
    changed.erase(std::unique(changed.begin(), changed.end()), changed.end());  // adjacent repeats
    const double* below = t + offsets[l - 1];
    double* level = t + offsets[l];
    for (i64 node : changed) {
      double sum = 0.0;
      for (i64 c = 0; c < FANOUT; ++c) sum += below[node * FANOUT + c];
      level[node] = sum;
    }
  }
  return 0;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(sf_engine_cpu, m) {
  m.def("sum_tree_sample(Tensor tree, int[] offsets, int[] sizes, Tensor uniforms) -> Tensor", sum_tree_sample);
  m.def("sum_tree_update(Tensor(a!) tree, int[] offsets, int[] sizes, int capacity, Tensor indices, "
        "Tensor priorities, bool only_positive) -> int",
        sum_tree_update);
}

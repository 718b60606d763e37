// Causal flash attention through cuDNN's fused SDPA, built with cudnn-frontend's graph API (see
// attention.h for layouts). Both graphs read and write strided [B, H, T, D] views of the caller's
// buffers, so the op needs no transposes; a built graph is executed with a variant pack that maps
// the fixed tensor uids below to this call's pointers.
#include "trainer/cuda/nn/flash_attention.h"

#include <cudnn.h>
#include <dlfcn.h>
// cudnn-frontend reaches cuDNN (and NVRTC, which only its experimental engines use) through
// dlopen/dlsym: the program then needs no NVRTC at all, and uses the libcudnn.so.9 it links.
#define NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING
#include <cudnn_frontend.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <exception>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace cudnn_frontend {
void* cudnn_dlhandle = nullptr;  // the frontend's handle on libcudnn (dynamic loading)
}  // namespace cudnn_frontend

namespace leantron::trainer::cuda {
namespace {

namespace fe = cudnn_frontend;
using TensorPtr = std::shared_ptr<fe::graph::Tensor_attributes>;
using Dims = std::vector<int64_t>;

// Uids of the tensors whose pointers the caller supplies (the variant packs' keys).
constexpr int64_t kQ = 1, kK = 2, kV = 3, kO = 4, kStats = 5, kDO = 6, kDQ = 7, kDK = 8, kDV = 9;

struct Shape {
  int64_t b, t, h, d;
  int64_t g = h;            // key/value heads
  bool interleaved = true;  // qkv rows [h][q | k | v][d]; else [q heads | (k, v) per group]
  Dims dims() const { return {b, h, t, d}; }
  Dims kv_dims() const { return {b, g, t, d}; }
  int64_t row() const { return interleaved ? 3 * h * d : (h + 2 * g) * d; }
  // Q, K, V (and their gradients) inside a qkv row.
  Dims q_strides() const { return {t * row(), interleaved ? 3 * d : d, row(), 1}; }
  Dims kv_strides() const { return {t * row(), interleaved ? 3 * d : 2 * d, row(), 1}; }
  int64_t k_offset() const { return interleaved ? d : h * d; }
  int64_t v_offset() const { return k_offset() + d; }
  // O and dO: [B, T, H, D] read as [B, H, T, D].
  Dims out_strides() const { return {t * h * d, d, h * d, 1}; }
  // Stats [B, H, T] as the packed [B, H, T, 1] cuDNN expects.
  Dims stats_dims() const { return {b, h, t, 1}; }
  Dims stats_strides() const { return {h * t, t, 1, 1}; }
};

absl::Status ToStatus(fe::error_t err, const std::string& step, const std::string& shape) {
  if (err.is_good()) return absl::OkStatus();
  const std::string msg =
      absl::StrCat("FlashAttention (", shape, "): cuDNN ", step, " failed: ", err.get_message());
  switch (err.get_code()) {
    case fe::error_code_t::GRAPH_NOT_SUPPORTED:
    case fe::error_code_t::HEURISTIC_QUERY_FAILED:
    case fe::error_code_t::GRAPH_EXECUTION_PLAN_CREATION_FAILED:
      return absl::UnimplementedError(msg);
    case fe::error_code_t::ATTRIBUTE_NOT_SET:
    case fe::error_code_t::SHAPE_DEDUCTION_FAILED:
    case fe::error_code_t::INVALID_VALUE:
      return absl::InvalidArgumentError(msg);
    default:
      return absl::InternalError(msg);
  }
}

std::shared_ptr<fe::graph::Graph> NewGraph() {
  auto graph = std::make_shared<fe::graph::Graph>();
  graph->set_io_data_type(fe::DataType_t::BFLOAT16)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  return graph;
}

TensorPtr Input(fe::graph::Graph& graph, const char* name, int64_t uid, const Dims& dims,
                const Dims& strides, fe::DataType_t type) {
  return graph.tensor(fe::graph::Tensor_attributes()
                          .set_name(name)
                          .set_uid(uid)
                          .set_dim(dims)
                          .set_stride(strides)
                          .set_data_type(type));
}

void MarkOutput(const TensorPtr& t, const char* name, int64_t uid, const Dims& dims,
                const Dims& strides, fe::DataType_t type) {
  t->set_output(true).set_name(name).set_uid(uid).set_dim(dims).set_stride(strides).set_data_type(
      type);
}

// validate → lower → heuristics (mode A, then the fallback list) → support check → build the
// first plan that builds; reports the plan's workspace.
absl::Status BuildPlans(fe::graph::Graph& graph, cudnnHandle_t handle, const std::string& what,
                        const std::string& shape, size_t* workspace) {
  auto step = [&](fe::error_t err, const char* name) {
    return ToStatus(std::move(err), absl::StrCat(what, " ", name), shape);
  };
  if (auto s = step(graph.validate(), "validate"); !s.ok()) return s;
  if (auto s = step(graph.build_operation_graph(handle), "build_operation_graph"); !s.ok())
    return s;
  if (auto s = step(graph.create_execution_plans({fe::HeurMode_t::A, fe::HeurMode_t::FALLBACK}),
                    "create_execution_plans");
      !s.ok())
    return s;
  if (auto s = step(graph.check_support(), "check_support"); !s.ok()) return s;
  if (auto s = step(graph.build_plans(fe::BuildPlanPolicy_t::HEURISTICS_CHOICE), "build_plans");
      !s.ok())
    return s;
  int64_t bytes = 0;
  if (auto s = step(graph.get_workspace_size(bytes), "get_workspace_size"); !s.ok()) return s;
  *workspace = static_cast<size_t>(bytes);
  return absl::OkStatus();
}

}  // namespace

struct FlashAttention::Impl {
  cudnnHandle_t handle = nullptr;
  std::shared_ptr<fe::graph::Graph> fwd, bwd;
  std::unordered_map<int64_t, void*> fwd_pack, bwd_pack;
  size_t workspace = 0;
  std::string shape;

  ~Impl() {
    fwd.reset();
    bwd.reset();
    if (handle != nullptr) cudnnDestroy(handle);
  }

  void Execute(const fe::graph::Graph& graph, std::unordered_map<int64_t, void*>& pack, void* ws,
               const char* what) {
    if (workspace > 0 && ws == nullptr) {
      const std::string detail =
          absl::StrFormat("%s: null workspace, %d bytes needed", shape, workspace);
      Die(what, detail.c_str(), __FILE__, __LINE__);
    }
    fe::error_t err = graph.execute(handle, pack, ws);
    if (err.is_bad()) {
      const std::string detail = absl::StrCat(shape, ": ", err.get_message());
      Die(what, detail.c_str(), __FILE__, __LINE__);
    }
  }
};

bool FlashAttentionSupported(int64_t head_dim, int64_t groups, int64_t heads) {
  return heads > 0 && groups == heads && head_dim > 0 && head_dim % 8 == 0 && head_dim <= 256;
}

FlashAttention::FlashAttention(int64_t batch, int64_t seq, int64_t heads, int64_t head_dim,
                               int64_t k_offset, int64_t v_offset, std::unique_ptr<Impl> impl)
    : batch_(batch),
      seq_(seq),
      heads_(heads),
      head_dim_(head_dim),
      k_offset_(k_offset),
      v_offset_(v_offset),
      impl_(std::move(impl)) {}

FlashAttention::~FlashAttention() = default;

absl::StatusOr<std::unique_ptr<FlashAttention>> FlashAttention::Create(
    int64_t batch, int64_t seq, int64_t heads, int64_t groups, int64_t head_dim, QkvLayout layout) {
  const std::string shape = absl::StrFormat("batch=%d seq=%d heads=%d groups=%d head_dim=%d", batch,
                                            seq, heads, groups, head_dim);
  if (batch <= 0 || seq <= 0 || heads <= 0 || groups <= 0 || head_dim <= 0)
    return absl::InvalidArgumentError(
        absl::StrCat("FlashAttention (", shape, "): every dimension must be positive"));
  if (layout == QkvLayout::kInterleaved && groups != heads)
    return absl::UnimplementedError(absl::StrCat(
        "FlashAttention (", shape,
        "): grouped queries are not a strided view of Megatron-Core's grouped qkv layout; use "
        "the attention layout (RearrangeQkv)"));
  if (heads % groups != 0)
    return absl::InvalidArgumentError(
        absl::StrCat("FlashAttention (", shape, "): heads must be a multiple of groups"));

  if (cudnn_frontend::cudnn_dlhandle == nullptr) {
    cudnn_frontend::cudnn_dlhandle = dlopen("libcudnn.so.9", RTLD_NOW | RTLD_GLOBAL);
    if (cudnn_frontend::cudnn_dlhandle == nullptr)
      return absl::FailedPreconditionError(
          absl::StrCat("FlashAttention (", shape, "): cannot load libcudnn.so.9: ", dlerror()));
  }
  auto impl = std::make_unique<Impl>();
  impl->shape = shape;
  if (cudnnStatus_t st = cudnnCreate(&impl->handle); st != CUDNN_STATUS_SUCCESS) {
    impl->handle = nullptr;
    return absl::FailedPreconditionError(absl::StrCat(
        "FlashAttention (", shape, "): cudnnCreate failed: ", cudnnGetErrorString(st)));
  }
  if (cudnnStatus_t st = cudnnSetStream(impl->handle, MainStream()); st != CUDNN_STATUS_SUCCESS)
    return absl::InternalError(absl::StrCat("FlashAttention (", shape,
                                            "): cudnnSetStream failed: ", cudnnGetErrorString(st)));

  const Shape s{batch, seq, heads, head_dim, groups, layout == QkvLayout::kInterleaved};
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  size_t fwd_ws = 0, bwd_ws = 0;
  try {
    {  // Forward: O, Stats = sdpa(Q, K, V), causal (query i sees keys j ≤ i).
      auto g = NewGraph();
      auto q = Input(*g, "Q", kQ, s.dims(), s.q_strides(), fe::DataType_t::BFLOAT16);
      auto k = Input(*g, "K", kK, s.kv_dims(), s.kv_strides(), fe::DataType_t::BFLOAT16);
      auto v = Input(*g, "V", kV, s.kv_dims(), s.kv_strides(), fe::DataType_t::BFLOAT16);
      auto attrs = fe::graph::SDPA_attributes()
                       .set_name("flash_attention_fwd")
                       .set_generate_stats(true)
                       .set_attn_scale(scale)
                       .set_diagonal_alignment(fe::DiagonalAlignment_t::TOP_LEFT)
                       .set_diagonal_band_right_bound(0);
      auto [o, stats] = g->sdpa(q, k, v, attrs);
      MarkOutput(o, "O", kO, s.dims(), s.out_strides(), fe::DataType_t::BFLOAT16);
      MarkOutput(stats, "Stats", kStats, s.stats_dims(), s.stats_strides(), fe::DataType_t::FLOAT);
      if (auto st = BuildPlans(*g, impl->handle, "forward", shape, &fwd_ws); !st.ok()) return st;
      impl->fwd = std::move(g);
    }
    {  // Backward: dQ, dK, dV = sdpa_backward(Q, K, V, O, dO, Stats), deterministic.
      auto g = NewGraph();
      auto q = Input(*g, "Q", kQ, s.dims(), s.q_strides(), fe::DataType_t::BFLOAT16);
      auto k = Input(*g, "K", kK, s.kv_dims(), s.kv_strides(), fe::DataType_t::BFLOAT16);
      auto v = Input(*g, "V", kV, s.kv_dims(), s.kv_strides(), fe::DataType_t::BFLOAT16);
      auto o = Input(*g, "O", kO, s.dims(), s.out_strides(), fe::DataType_t::BFLOAT16);
      auto d_o = Input(*g, "dO", kDO, s.dims(), s.out_strides(), fe::DataType_t::BFLOAT16);
      auto stats =
          Input(*g, "Stats", kStats, s.stats_dims(), s.stats_strides(), fe::DataType_t::FLOAT);
      auto attrs = fe::graph::SDPA_backward_attributes()
                       .set_name("flash_attention_bwd")
                       .set_attn_scale(scale)
                       .set_diagonal_alignment(fe::DiagonalAlignment_t::TOP_LEFT)
                       .set_diagonal_band_right_bound(0)
                       .set_deterministic_algorithm(true);
      auto [dq, dk, dv] = g->sdpa_backward(q, k, v, o, d_o, stats, attrs);
      MarkOutput(dq, "dQ", kDQ, s.dims(), s.q_strides(), fe::DataType_t::BFLOAT16);
      MarkOutput(dk, "dK", kDK, s.kv_dims(), s.kv_strides(), fe::DataType_t::BFLOAT16);
      MarkOutput(dv, "dV", kDV, s.kv_dims(), s.kv_strides(), fe::DataType_t::BFLOAT16);
      if (auto st = BuildPlans(*g, impl->handle, "backward", shape, &bwd_ws); !st.ok()) return st;
      impl->bwd = std::move(g);
    }
  } catch (const std::exception& e) {
    return absl::InternalError(
        absl::StrCat("FlashAttention (", shape, "): cudnn-frontend threw: ", e.what()));
  }
  impl->workspace = std::max(fwd_ws, bwd_ws);
  impl->fwd_pack = {{kQ, nullptr}, {kK, nullptr}, {kV, nullptr}, {kO, nullptr}, {kStats, nullptr}};
  impl->bwd_pack = {{kQ, nullptr},  {kK, nullptr},  {kV, nullptr},
                    {kO, nullptr},  {kDO, nullptr}, {kStats, nullptr},
                    {kDQ, nullptr}, {kDK, nullptr}, {kDV, nullptr}};
  return std::unique_ptr<FlashAttention>(
      new FlashAttention(batch, seq, heads, head_dim, s.k_offset(), s.v_offset(), std::move(impl)));
}

size_t FlashAttention::workspace_bytes() const { return impl_->workspace; }

void FlashAttention::Forward(bf16* out, float* stats, const bf16* qkv, void* workspace) {
  bf16* base = const_cast<bf16*>(qkv);
  auto& pack = impl_->fwd_pack;
  pack[kQ] = base;
  pack[kK] = base + k_offset_;
  pack[kV] = base + v_offset_;
  pack[kO] = out;
  pack[kStats] = stats;
  impl_->Execute(*impl_->fwd, pack, workspace, "FlashAttention forward (cuDNN SDPA execute)");
}

void FlashAttention::Backward(bf16* dqkv, const bf16* dout, const bf16* qkv, const bf16* out,
                              const float* stats, void* workspace) {
  bf16* base = const_cast<bf16*>(qkv);
  auto& pack = impl_->bwd_pack;
  pack[kQ] = base;
  pack[kK] = base + k_offset_;
  pack[kV] = base + v_offset_;
  pack[kO] = const_cast<bf16*>(out);
  pack[kDO] = const_cast<bf16*>(dout);
  pack[kStats] = const_cast<float*>(stats);
  pack[kDQ] = dqkv;
  pack[kDK] = dqkv + k_offset_;
  pack[kDV] = dqkv + v_offset_;
  impl_->Execute(*impl_->bwd, pack, workspace, "FlashAttention backward (cuDNN SDPA execute)");
}

}  // namespace leantron::trainer::cuda

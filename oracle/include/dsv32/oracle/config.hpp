// Configuration of the DeepSeek-V3.2 attention stack (MATH.md section 1).
#pragma once

#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace dsv32 {

/// Raised for any invalid configuration field; the message names the field.
struct ConfigError : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

/// Layout of the indexer's RoPE on the first dr dims of each 128-vector.
enum class IndexerRope { neox, interleaved };
/// Hadamard rotation of indexer q and k before fp8 quantization (DeepSeek reference).
enum class Hadamard { off, on };
/// Storage format of the MLA latent cache.
enum class KvCache { bf16, fp8_ds_mla };
/// Precision of the cos/sin table.
enum class RopeTable { fp32, bf16 };
/// Storage precision of activations (bf16 = deployed; fp32 = tight comparisons).
enum class Precision { bf16, fp32 };
/// How decode-context-parallel ranks select keys (MATH.md, context-parallel shards): `exact`
/// (vLLM's default) one global top-k that every rank holds; `union_` ("union") each rank its
/// own top-k of the keys it owns.
enum class DcpIndexerMode { exact, union_ };

std::string_view to_string(IndexerRope v);
std::string_view to_string(Hadamard v);
std::string_view to_string(KvCache v);
std::string_view to_string(RopeTable v);
std::string_view to_string(Precision v);
std::string_view to_string(DcpIndexerMode v);
/// Parses the names of MATH.md (e.g. "neox", "fp8_ds_mla"); throws ConfigError naming `field`.
template <class E>
E parse_enum(std::string_view field, std::string_view text);

/// YaRN rope scaling parameters (DSv3.2 defaults).
struct Yarn {
  double factor = 40.0;
  int original_max_position_embeddings = 4096;
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  double mscale = 1.0;
  double mscale_all_dim = 1.0;
  bool operator==(const Yarn&) const = default;
};

/// Stated bounds of Config::validate, far above any real model (DeepSeek-V3.2: 61 layers, D 7168,
/// 128 heads), so that no product of sizes overflows and no absurd config reaches an allocation.
inline constexpr int kMaxConfigLayers = 1024;
inline constexpr int kMaxConfigSize = 1 << 20;  // any one size: D, H, ranks, head dims, K, B
inline constexpr int kMaxDcpSize = 64;          // DCP ranks (vLLM deploys 2 to 8)

/// Every field and switch of MATH.md section 1, with Hugging Face style names.
struct Config {
  std::string name = "custom";
  int num_layers = 1;
  int hidden_size = 0;       // D
  int num_heads = 0;         // H (on this rank)
  int q_lora_rank = 0;       // Rq
  int kv_lora_rank = 0;      // Lkv
  int qk_nope_head_dim = 0;  // dn
  int qk_rope_head_dim = 0;  // dr
  int v_head_dim = 0;        // dv
  int index_n_heads = 0;     // HI
  int index_head_dim = 128;  // dI
  int index_topk = 0;        // K
  int block_size = 64;       // B
  double rms_norm_eps = 1e-6;
  double indexer_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  std::optional<Yarn> rope_scaling = Yarn{};
  std::string index_topk_pattern = "F";
  IndexerRope indexer_rope = IndexerRope::neox;
  Hadamard hadamard = Hadamard::off;
  KvCache kv_cache = KvCache::bf16;
  RopeTable rope_table = RopeTable::fp32;
  Precision precision = Precision::bf16;
  /// Decode context parallelism (vLLM's decode_context_parallel_size, cp_kv_cache_interleave_size):
  /// the keys of a request spread over dcp_size ranks in runs of dcp_interleave positions.
  int dcp_size = 1;
  int dcp_interleave = 1;  // must divide block_size (vLLM refuses other layouts)
  DcpIndexerMode dcp_indexer_mode = DcpIndexerMode::exact;

  bool operator==(const Config&) const = default;

  /// Throws ConfigError naming the first bad field (bounds above; reals finite).
  void validate() const;
  /// sigma = (dn+dr)^-1/2 * m^2 with m = 0.1*mscale_all_dim*ln(s)+1 under YaRN, else 1.
  double softmax_scale() const;
  /// True when layer l owns an indexer (pattern letter 'F').
  bool is_full_layer(int l) const { return index_topk_pattern.at(l) == 'F'; }
  int qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
  int qkv_a_rows() const { return q_lora_rank + kv_lora_rank + qk_rope_head_dim; }
  /// Weights of one F layer (the MLA projections and the indexer's), as a count of values.
  double layer_weight_count() const;
  /// Floats in one MLA cache entry: latent then rope part.
  int kv_entry_dim() const { return kv_lora_rank + qk_rope_head_dim; }
  /// A copy with num_heads restricted to one of `tp` equal shards (the indexer is replicated).
  /// Under DCP, tp > 1 must be a multiple of dcp_size (a DCP group is dcp_size ranks of the TP
  /// group); tp 1 is the whole layer, its DCP ranks emulated in one process.
  Config tp_shard(int tp) const;
};

/// Names of the built-in presets: dsv32, dsv32-tp4, glm52, tiny-*.
std::vector<std::string> preset_names();
/// A validated preset; throws ConfigError for an unknown name (listing the known ones).
Config preset(std::string_view name);

/// vLLM's derivation: layer l skips top-k (S) iff max(l - offset + 1, 0) % freq != 0.
std::string topk_pattern_from_vllm(int num_layers, int index_topk_freq, int index_skip_topk_offset);

}  // namespace dsv32

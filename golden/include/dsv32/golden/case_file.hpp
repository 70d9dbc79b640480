// Golden cases from a file (docs/CASES.md): a case's config (a preset, GOLDEN.md's keys or a
// Hugging Face config.json, with overrides), seed, cache and steps as JSON. The registry's own
// cases are such files (fixtures/cases/), built into the library.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

#include "dsv32/golden/golden.hpp"

namespace dsv32::golden {

/// A case file that cannot be used: the message names the file and the field
/// ("case.json: steps[1].requests[0].new_tokens: expected an integer >= 1, got 0").
struct CaseFileError : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

/// Bounds a case file may not exceed (each named in the error that refuses it).
struct CaseLimits {
  int max_layers = 128;
  int max_steps = 4096;
  int max_tokens_per_step = 65536;
  int max_blocks = 1 << 22;
  int max_given_prefix = 1 << 20;  // positions of one request's given prefix
};

/// The case of JSON text `text`; `where` names it in errors and `dir` is the folder that a
/// relative `hf_config` path is read from.
CaseSpec case_from_json(const std::string& text, const std::string& where,
                        const std::string& dir = ".", const CaseLimits& limits = {});
/// The case of file `path`.
CaseSpec read_case_file(const std::string& path, const CaseLimits& limits = {});

/// The Config of a Hugging Face config.json of a DeepSeek-V3.2-style model (its names mapped to
/// MATH.md's: `num_attention_heads`, `rope_scaling` or `rope_parameters`,
/// `indexer_rope_interleave`, `index_topk_freq` / `index_skip_topk_offset` for the F/S pattern
/// over `num_layers` layers). Keys it does not use (experts, vocabulary) are ignored; a missing
/// attention key is an error naming it.
Config config_from_hf(const std::string& json_text, int num_layers, const std::string& where);

/// What generating `spec` costs, roughly: bytes held at once and seconds on this machine kind
/// (2 cores), from the sizes alone.
struct CaseEstimate {
  double bytes = 0, seconds = 0;
};
CaseEstimate estimate(const CaseSpec& spec);

/// The stages a candidate of `spec` provides per step, with their shapes (the skeleton a user
/// fills; docs/CANDIDATE.md), as JSON text.
std::string candidate_skeleton(const CaseSpec& spec);

}  // namespace dsv32::golden

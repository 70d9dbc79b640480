// Judging committed goldens' own traces with defects put in: the helpers the judge's suites share.
#pragma once

#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "dsv32/golden/golden.hpp"
#include "dsv32/judge/judge.hpp"

namespace dsv32::testing {

/// `candidate` judged against golden `gc` (the strict mode: every stage required).
inline Judgement judge_case(const golden::GoldenCase& gc, const std::vector<StepTrace>& candidate) {
  return judge(gc.cfg, std::make_shared<const Weights>(gc.weights), gc.num_blocks, gc.steps,
               candidate);
}

/// The tensor `name` of a layer trace, to change it.
inline Tensor& stage_of(LayerTrace& lt, const std::string& name) {
  for (Tensor& t : lt.tensors)
    if (t.name == name) return t;
  throw std::out_of_range("no stage " + name);
}

}  // namespace dsv32::testing

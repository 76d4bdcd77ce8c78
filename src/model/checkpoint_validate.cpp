#include "model/checkpoint_validate.h"

#include <unordered_set>

#include "core/error.h"

namespace di {

namespace {

constexpr size_t kMaxReported = 20;

std::string describe(DType dt, const std::vector<int64_t>& shape) {
  return std::string(dtype_name(dt)) + " " + shape_string(shape);
}

}  // namespace

ValidationReport validate_checkpoint(const ModelConfig& cfg, const Checkpoint& ckpt, bool allow_unexpected) {
  ValidationReport report;
  std::vector<std::string> problems;
  size_t n_problems = 0;
  auto problem = [&](std::string msg) {
    if (problems.size() < kMaxReported) problems.push_back(std::move(msg));
    ++n_problems;
  };

  const std::vector<ExpectedTensor> expected = expected_tensors(cfg);
  std::unordered_set<std::string_view> expected_names;
  expected_names.reserve(expected.size());
  for (const ExpectedTensor& e : expected) {
    expected_names.insert(e.name);
    const TensorView* v = ckpt.find(e.name);
    if (!v) {
      if (e.optional) {
        ++report.n_optional_missing;
      } else {
        problem("missing tensor '" + e.name + "' (expected " + describe(e.dtype, e.shape) + ")");
      }
      continue;
    }
    if (v->dtype != e.dtype || v->shape != e.shape) {
      problem("tensor '" + e.name + "' in " + v->file + " is " + describe(v->dtype, v->shape) + ", expected " +
              describe(e.dtype, e.shape));
      continue;
    }
    ++report.n_expected_found;
  }
  for (const auto& [name, v] : ckpt.tensors()) {
    if (expected_names.count(name)) continue;
    if (is_vision_tensor(name)) {
      ++report.n_vision_ignored;
      continue;
    }
    if (allow_unexpected) {
      ++report.n_unexpected;
    } else {
      problem("unexpected tensor '" + name + "' (" + describe(v.dtype, v.shape) + ") in " + v.file +
              ": the config implies no such tensor (--allow-unexpected ignores it)");
    }
  }
  if (n_problems > 0) {
    std::string msg = "checkpoint does not match the config (" + std::to_string(n_problems) + " problem" +
                      (n_problems == 1 ? "" : "s") + "):";
    for (const std::string& p : problems) msg += "\n  " + p;
    if (n_problems > problems.size()) {
      msg += "\n  ... and " + std::to_string(n_problems - problems.size()) + " more";
    }
    throw Error(msg);
  }
  return report;
}

}  // namespace di

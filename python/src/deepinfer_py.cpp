// deepinfer._deepinfer: a thin pybind11 layer over the public engine API (include/deepinfer/engine.h).
// The Python-facing API (LLM, SamplingParams, RequestOutput) is python/deepinfer/__init__.py; this
// file only moves values across and waits for results with the GIL released.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "runtime/default_model.h"
#include "core/error.h"
#include "deepinfer/engine.h"

namespace py = pybind11;

namespace {

di::PrefixCacheMode prefix_cache_mode(const std::string& text) {
  if (text == "off") return di::PrefixCacheMode::kOff;
  if (text == "replay") return di::PrefixCacheMode::kReplay;
  if (text == "exact") return di::PrefixCacheMode::kExact;
  throw di::Error("prefix_cache: expected 'off', 'replay' or 'exact', got '" + text + "'");
}

std::string prefix_cache_name(di::PrefixCacheMode mode) {
  switch (mode) {
    case di::PrefixCacheMode::kOff: return "off";
    case di::PrefixCacheMode::kReplay: return "replay";
    case di::PrefixCacheMode::kExact: return "exact";
  }
  return "?";
}

// One request from Python: (kind, payload) with kind "prompt" (str), "prompt_ids" (list[int]) or
// "chat_json" (str, an OpenAI chat-completions body).
di::Request make_request(const std::pair<std::string, py::object>& input, const di::SamplingParams& sampling) {
  di::Request r;
  const auto& [kind, payload] = input;
  if (kind == "prompt") {
    r.prompt = payload.cast<std::string>();
  } else if (kind == "prompt_ids") {
    r.prompt_ids = payload.cast<std::vector<int32_t>>();
  } else if (kind == "chat_json") {
    r.chat_json = payload.cast<std::string>();
  } else {
    throw di::Error("request kind: expected prompt, prompt_ids or chat_json, got '" + kind + "'");
  }
  r.sampling = sampling;
  return r;
}

// Submits every request, then collects the results in order. The GIL is released while waiting;
// every 100 ms it is taken back to let Python handle signals: on KeyboardInterrupt the requests not
// yet collected are cancelled and the exception propagates.
std::vector<di::RequestResult> run(di::Engine& engine, const std::vector<std::pair<std::string, py::object>>& inputs,
                                   const std::vector<di::SamplingParams>& sampling) {
  if (inputs.size() != sampling.size())
    throw di::Error("run: " + std::to_string(inputs.size()) + " requests but " + std::to_string(sampling.size()) +
                    " sampling params");
  std::vector<di::Request> requests;
  requests.reserve(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) requests.push_back(make_request(inputs[i], sampling[i]));

  std::vector<di::RequestId> ids;
  std::vector<di::RequestResult> results;
  ids.reserve(requests.size());
  results.reserve(requests.size());
  py::gil_scoped_release release;
  for (di::Request& r : requests) ids.push_back(engine.submit(std::move(r)));
  for (size_t i = 0; i < ids.size(); ++i) {
    // A request that is not streamed has one event, the finished one.
    while (!engine.next_event(ids[i], std::chrono::milliseconds(100))) {
      py::gil_scoped_acquire acquire;
      if (PyErr_CheckSignals() == 0) continue;
      {
        py::gil_scoped_release again;
        for (size_t j = i; j < ids.size(); ++j) engine.cancel(ids[j]);
        for (size_t j = i; j < ids.size(); ++j) engine.wait(ids[j]);
      }
      throw py::error_already_set();
    }
    results.push_back(engine.wait(ids[i]));
  }
  return results;
}

// Engine text is UTF-8; a token list cut inside a character must not make Python raise.
py::str utf8(const std::string& s) {
  PyObject* o = PyUnicode_DecodeUTF8(s.data(), static_cast<Py_ssize_t>(s.size()), "replace");
  if (!o) throw py::error_already_set();
  return py::reinterpret_steal<py::str>(o);
}

py::dict stats_dict(const di::EngineStats& s) {
  py::dict d;
  d["steps"] = s.steps;
  d["requests_submitted"] = s.requests_submitted;
  d["requests_finished"] = s.requests_finished;
  d["requests_cancelled"] = s.requests_cancelled;
  d["requests_failed"] = s.requests_failed;
  d["running"] = s.running;
  d["waiting"] = s.waiting;
  d["prompt_tokens"] = s.prompt_tokens;
  d["generated_tokens"] = s.generated_tokens;
  d["prefix_hit_tokens"] = s.prefix_hit_tokens;
  d["prefix_lookup_tokens"] = s.prefix_lookup_tokens;
  d["preemptions"] = s.preemptions;
  d["kv_used_bytes"] = s.kv_used_bytes;
  d["kv_capacity_bytes"] = s.kv_capacity_bytes;
  d["prefix_cache_bytes"] = s.prefix_cache_bytes;
  d["kv_pages_in_use"] = s.kv_pages_in_use;
  d["busy_seconds"] = s.busy_seconds;
  d["host_gap_seconds"] = s.host_gap_seconds;
  return d;
}

}  // namespace

PYBIND11_MODULE(_deepinfer, m) {
  m.doc() = "DeepInfer engine binding (use the deepinfer package, not this module)";
  py::register_exception<di::Error>(m, "DeepInferError", PyExc_RuntimeError);
  m.def("default_model_dir", [] { return di::default_model_dir().string(); });

  py::class_<di::SamplingParams>(m, "SamplingParams")
      .def(py::init<>())
      .def_readwrite("temperature", &di::SamplingParams::temperature)
      .def_readwrite("top_k", &di::SamplingParams::top_k)
      .def_readwrite("top_p", &di::SamplingParams::top_p)
      .def_readwrite("min_p", &di::SamplingParams::min_p)
      .def_readwrite("repetition_penalty", &di::SamplingParams::repetition_penalty)
      .def_readwrite("presence_penalty", &di::SamplingParams::presence_penalty)
      .def_readwrite("frequency_penalty", &di::SamplingParams::frequency_penalty)
      .def_readwrite("max_tokens", &di::SamplingParams::max_tokens)
      .def_readwrite("stop", &di::SamplingParams::stop)
      .def_readwrite("stop_token_ids", &di::SamplingParams::stop_token_ids)
      .def_readwrite("ignore_eos", &di::SamplingParams::ignore_eos)
      .def_readwrite("include_stop_str_in_output", &di::SamplingParams::include_stop_str_in_output)
      .def_readwrite("logprobs", &di::SamplingParams::logprobs)
      .def_readwrite("seed", &di::SamplingParams::seed);

  py::class_<di::EngineOptions>(m, "EngineOptions")
      .def(py::init<>())
      .def_property(
          "model_dir", [](const di::EngineOptions& o) { return o.model_dir.string(); },
          [](di::EngineOptions& o, const std::string& dir) { o.model_dir = dir; })
      .def_readwrite("device", &di::EngineOptions::device)
      .def_readwrite("max_step_tokens", &di::EngineOptions::max_step_tokens)
      .def_readwrite("max_running", &di::EngineOptions::max_running)
      .def_readwrite("kv_capacity_bytes", &di::EngineOptions::kv_capacity_bytes)
      .def_property(
          "prefix_cache", [](const di::EngineOptions& o) { return prefix_cache_name(o.prefix_cache); },
          [](di::EngineOptions& o, const std::string& mode) { o.prefix_cache = prefix_cache_mode(mode); })
      .def_readwrite("prefix_cache_bytes", &di::EngineOptions::prefix_cache_bytes)
      .def_readwrite("exact_snapshot_blocks", &di::EngineOptions::exact_snapshot_blocks)
      .def_readwrite("decoder_replay", &di::EngineOptions::decoder_replay)
      .def_readwrite("batch_invariant", &di::EngineOptions::batch_invariant)
      .def_readwrite("fast_fp4_gemm", &di::EngineOptions::fast_fp4_gemm)
      .def_readwrite("async_scheduling", &di::EngineOptions::async_scheduling);

  py::class_<di::TokenLogprob>(m, "TokenLogprob")
      .def_readonly("id", &di::TokenLogprob::id)
      .def_readonly("logprob", &di::TokenLogprob::logprob)
      .def("__repr__", [](const di::TokenLogprob& t) {
        return "TokenLogprob(id=" + std::to_string(t.id) + ", logprob=" + std::to_string(t.logprob) + ")";
      });

  py::class_<di::RequestResult>(m, "RequestResult")
      .def_property_readonly("text", [](const di::RequestResult& r) { return utf8(r.text); })
      .def_readonly("token_ids", &di::RequestResult::token_ids)
      .def_readonly("logprobs", &di::RequestResult::logprobs)
      .def_readonly("top_logprobs", &di::RequestResult::top_logprobs)
      .def_readonly("finish_reason", &di::RequestResult::finish_reason)
      .def_property_readonly("error", [](const di::RequestResult& r) { return utf8(r.error); })
      .def_readonly("prompt_tokens", &di::RequestResult::prompt_tokens)
      .def_readonly("completion_tokens", &di::RequestResult::completion_tokens)
      .def_readonly("cached_tokens", &di::RequestResult::cached_tokens);

  py::class_<di::Engine, std::unique_ptr<di::Engine>>(m, "Engine")
      .def(py::init([](const di::EngineOptions& options) {
             py::gil_scoped_release release;
             return di::Engine::create(options);
           }),
           py::arg("options"))
      .def("run", &run, py::arg("requests"), py::arg("sampling"))
      .def("stats", [](const di::Engine& e) { return stats_dict(e.stats()); })
      .def("tokenize", &di::Engine::tokenize, py::arg("text"), py::arg("add_bos"))
      .def(
          "detokenize", [](const di::Engine& e, const std::vector<int32_t>& ids) { return utf8(e.detokenize(ids)); },
          py::arg("ids"));
}

"""DeepInfer from Python: offline generation and chat through the C++ engine.

    from deepinfer import LLM, SamplingParams
    llm = LLM(model="path/to/model")      # LLM() runs the embedded default model
    out = llm.generate(["Once upon a time"], SamplingParams(max_tokens=32, temperature=0))
    print(out[0].outputs[0].text, out[0].outputs[0].finish_reason)
    out = llm.chat([{"role": "user", "content": "Hello"}])

Results follow vLLM's shape: a list of RequestOutput in input order, each with outputs[0] a
CompletionOutput (text, token_ids, finish_reason). A request the engine rejects (bad sampling
value, prompt longer than the context, bad chat message) raises DeepInferError with the engine's
message. The GIL is released while the engine works; Ctrl-C cancels the batch.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, List, Optional, Sequence, Union

from . import _deepinfer
from ._deepinfer import DeepInferError

__all__ = ["LLM", "SamplingParams", "RequestOutput", "CompletionOutput", "DeepInferError"]


@dataclasses.dataclass
class SamplingParams:
    """How to sample one request. temperature 0 is greedy; a seed makes sampling reproducible.

    max_tokens None generates until a stop or the context is full. top_k 0 (or -1) is off.
    stop is a string or a list of strings; the output ends before the first match.
    logprobs None returns none; 0 the sampled token's logprob; N also the top N per token.
    """

    max_tokens: Optional[int] = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: Optional[int] = None
    stop: Union[None, str, List[str]] = None
    stop_token_ids: Optional[List[int]] = None
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False
    logprobs: Optional[int] = None

    def _to_engine(self) -> "_deepinfer.SamplingParams":
        p = _deepinfer.SamplingParams()
        p.max_tokens = self.max_tokens
        p.temperature = self.temperature
        p.top_p = self.top_p
        p.top_k = 0 if self.top_k == -1 else self.top_k
        p.min_p = self.min_p
        p.repetition_penalty = self.repetition_penalty
        p.presence_penalty = self.presence_penalty
        p.frequency_penalty = self.frequency_penalty
        p.seed = self.seed
        p.stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        p.stop_token_ids = list(self.stop_token_ids or [])
        p.ignore_eos = self.ignore_eos
        p.include_stop_str_in_output = self.include_stop_str_in_output
        p.logprobs = -1 if self.logprobs is None else self.logprobs
        return p


@dataclasses.dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: List[int]
    finish_reason: str  # "stop" | "length"
    logprobs: Optional[List[float]] = None  # per generated token, when requested
    top_logprobs: Optional[List[List[Any]]] = None  # per token: TokenLogprob(id, logprob), best first


@dataclasses.dataclass
class RequestOutput:
    prompt: Any  # the prompt as given: text, token ids, or the chat messages
    outputs: List[CompletionOutput]
    num_prompt_tokens: int
    num_cached_tokens: int  # prompt tokens served from the prefix cache
    finished: bool = True


_Prompt = Union[str, List[int]]


class LLM:
    """One engine over one model, for the lifetime of this object.

    model: a checkpoint directory in the released V4.1 format; None is the embedded default model.
    device: "cpu" or "cuda". prefix_cache: "off", "replay" (approximate, SWA bounded replay) or
    "exact" (exact_snapshot_blocks: blocks of 64 positions between its local-state snapshots).
    batch_invariant: a request's output independent of what it is batched with.
    fast_fp4_gemm: on CUDA, the MXFP4 expert GEMMs sum on the FP8 wgmma tensor cores (~14-bit block
    sums, as DeepGEMM): a faster MoE at batch >= 8, no longer the CPU reference's results to rounding.
    async_scheduling: prepare the next step while the current one runs.
    """

    def __init__(
        self,
        model: Optional[str] = None,
        *,
        device: str = "cpu",
        prefix_cache: str = "replay",
        batch_invariant: bool = False,
        fast_fp4_gemm: bool = False,
        async_scheduling: bool = True,
        max_running: int = 64,
        max_step_tokens: int = 2048,
        kv_capacity_bytes: int = 0,
        prefix_cache_bytes: int = 0,
        exact_snapshot_blocks: int = 1,
    ):
        o = _deepinfer.EngineOptions()
        o.model_dir = str(model) if model is not None else _deepinfer.default_model_dir()
        o.device = device
        o.prefix_cache = prefix_cache
        o.batch_invariant = batch_invariant
        o.fast_fp4_gemm = fast_fp4_gemm
        o.async_scheduling = async_scheduling
        o.max_running = max_running
        o.max_step_tokens = max_step_tokens
        o.kv_capacity_bytes = kv_capacity_bytes
        o.prefix_cache_bytes = prefix_cache_bytes
        o.exact_snapshot_blocks = exact_snapshot_blocks
        self.model = o.model_dir
        self._engine = _deepinfer.Engine(o)

    def generate(
        self,
        prompts: Union[_Prompt, Sequence[_Prompt]],
        sampling_params: Union[None, SamplingParams, Sequence[SamplingParams]] = None,
    ) -> List[RequestOutput]:
        """prompts: a string, a list of token ids, or a list of either. Text gets BOS + its tokens;
        token ids are used as given. sampling_params: one for all, or one per prompt."""
        if isinstance(prompts, str) or (isinstance(prompts, list) and prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        inputs = []
        for p in prompts:
            if isinstance(p, str):
                inputs.append(("prompt", p))
            elif isinstance(p, (list, tuple)) and all(isinstance(t, int) for t in p):
                inputs.append(("prompt_ids", list(p)))
            else:
                raise TypeError(f"prompt: expected a string or a list of token ids, got {type(p).__name__}")
        return self._run(inputs, list(prompts), sampling_params)

    def chat(
        self,
        messages: Union[List[dict], Sequence[List[dict]]],
        sampling_params: Union[None, SamplingParams, Sequence[SamplingParams]] = None,
        *,
        thinking: bool = False,
        tools: Optional[List[dict]] = None,
        reasoning_effort: Union[None, int, str] = None,
    ) -> List[RequestOutput]:
        """messages: one conversation (a list of OpenAI-style message dicts) or a list of them.
        Rendered with the V4.1 chat encoding; thinking mode is off unless thinking=True."""
        conversations = [messages] if messages and isinstance(messages[0], dict) else list(messages)
        inputs = []
        for conv in conversations:
            body = {"messages": conv, "thinking": thinking}
            if tools is not None:
                body["tools"] = tools
            if reasoning_effort is not None:
                body["reasoning_effort"] = reasoning_effort
            inputs.append(("chat_json", json.dumps(body)))
        return self._run(inputs, conversations, sampling_params)

    def tokenize(self, text: str, add_bos: bool = False) -> List[int]:
        return self._engine.tokenize(text, add_bos)

    def detokenize(self, token_ids: List[int]) -> str:
        return self._engine.detokenize(token_ids)

    def stats(self) -> dict:
        """The engine's counters: steps, tokens, prefix-cache hits, KV use, busy time..."""
        return self._engine.stats()

    def _run(self, inputs, prompts, sampling_params) -> List[RequestOutput]:
        if sampling_params is None:
            sampling_params = SamplingParams()
        if isinstance(sampling_params, SamplingParams):
            sampling = [sampling_params._to_engine()] * len(inputs)
        else:
            if len(sampling_params) != len(inputs):
                raise ValueError(f"sampling_params: {len(sampling_params)} given for {len(inputs)} prompts")
            sampling = [sp._to_engine() for sp in sampling_params]
        results = self._engine.run(inputs, sampling)
        outputs = []
        for i, (prompt, r) in enumerate(zip(prompts, results)):
            if r.finish_reason == "error":
                raise DeepInferError(f"request {i}: {r.error}")
            want_logprobs = bool(r.logprobs)
            completion = CompletionOutput(
                index=0,
                text=r.text,
                token_ids=list(r.token_ids),
                finish_reason=r.finish_reason,
                logprobs=list(r.logprobs) if want_logprobs else None,
                top_logprobs=[list(t) for t in r.top_logprobs] if r.top_logprobs else None,
            )
            outputs.append(RequestOutput(prompt, [completion], r.prompt_tokens, r.cached_tokens))
        return outputs

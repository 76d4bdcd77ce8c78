"""The Python API (deepinfer.LLM) on the tiny golden model: generate with SamplingParams, chat,
engine errors as DeepInferError, reproducible seeded sampling. Prompts are drawn fresh each run
(the seed is printed; DI_SEED replays it).

Run by ctest (tests/CMakeLists.txt) with the interpreter the module was built for and
PYTHONPATH=<build>/python, DI_TEST_MODEL=<repo>/tests/data/golden_dev/model.
"""

import os
import random
import threading
import time
import unittest

from deepinfer import LLM, CompletionOutput, DeepInferError, RequestOutput, SamplingParams

MODEL = os.environ.get("DI_TEST_MODEL")
SEED = int(os.environ.get("DI_SEED", time.time_ns() % 1_000_000_007))
print(f"seed {SEED} (DI_SEED={SEED} replays)", flush=True)
RNG = random.Random(SEED)
WORDS = "the a cat dog sat on mat river stone quick brown fox jumps over lazy sun moon green tree".split()


def prompt() -> str:
    return " ".join(RNG.choice(WORDS) for _ in range(RNG.randint(2, 8)))


class ApiTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        # batch invariant: a prompt gives the same tokens alone and in a batch
        cls.llm = LLM(model=MODEL, batch_invariant=True)

    def without_special(self, ids):
        """The text of a result skips special tokens; detokenize() keeps them."""
        def special(t):
            s = self.llm.detokenize([t])
            return (s.startswith("<\uff5c") and s.endswith("\uff5c>")) or s in ("<think>", "</think>")
        return [t for t in ids if not special(t)]

    def test_generate_in_order_with_fields(self):
        prompts = [prompt() for _ in range(4)]
        limits = [1, 4, 7, 3]
        params = [SamplingParams(max_tokens=n, temperature=0, ignore_eos=True) for n in limits]
        outs = self.llm.generate(prompts, params)
        self.assertEqual(len(outs), 4)
        for p, n, o in zip(prompts, limits, outs):
            self.assertIsInstance(o, RequestOutput)
            self.assertEqual(o.prompt, p)
            c = o.outputs[0]
            self.assertIsInstance(c, CompletionOutput)
            self.assertEqual(len(c.token_ids), n)
            self.assertEqual(c.finish_reason, "length")
            self.assertIsInstance(c.text, str)
            if "\ufffd" not in c.text:  # a cut character may be replaced differently
                self.assertEqual(c.text, self.llm.detokenize(self.without_special(c.token_ids)))
            self.assertEqual(o.num_prompt_tokens, len(self.llm.tokenize(p, add_bos=True)))

    def test_greedy_matches_one_by_one_and_token_ids(self):
        prompts = [prompt() for _ in range(3)]
        sp = SamplingParams(max_tokens=6, temperature=0)
        batch = [o.outputs[0].token_ids for o in self.llm.generate(prompts, sp)]
        alone = [self.llm.generate(p, sp)[0].outputs[0].token_ids for p in prompts]
        self.assertEqual(batch, alone)
        # BOS + the text's tokens, given as ids, is the same prompt.
        ids = self.llm.tokenize(prompts[0], add_bos=True)
        self.assertEqual(self.llm.generate([ids], sp)[0].outputs[0].token_ids, alone[0])

    def test_seed_reproduces(self):
        p = prompt()
        seed = RNG.randrange(1 << 32)
        sp = SamplingParams(max_tokens=12, temperature=1.0, seed=seed, ignore_eos=True)
        a = self.llm.generate(p, sp)[0].outputs[0].token_ids
        b = self.llm.generate(p, sp)[0].outputs[0].token_ids
        self.assertEqual(a, b)
        others = {tuple(self.llm.generate(p, SamplingParams(max_tokens=12, temperature=1.0, seed=seed + k,
                                                             ignore_eos=True))[0].outputs[0].token_ids)
                  for k in range(1, 4)}
        self.assertGreater(len(others | {tuple(a)}), 1, "four seeds gave the same tokens")

    def test_stop_string(self):
        p = prompt()
        full = self.llm.generate(p, SamplingParams(max_tokens=24, temperature=0, ignore_eos=True))[0].outputs[0].text
        if len(full) < 4:
            self.skipTest(f"text too short for a stop string: {full!r}")
        k = len(full) // 3
        stop = full[k:k + 2]
        c = self.llm.generate(p, SamplingParams(max_tokens=24, temperature=0, ignore_eos=True, stop=stop))[0].outputs[0]
        self.assertEqual(c.finish_reason, "stop")
        self.assertEqual(c.text, full[: full.find(stop)])

    def test_chat(self):
        conv = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": prompt()}]
        sp = SamplingParams(max_tokens=5, temperature=0)
        out = self.llm.chat(conv, sp)
        self.assertEqual(len(out), 1)
        reply = out[0].outputs[0]
        self.assertIn(reply.finish_reason, ("stop", "length"))
        self.assertEqual(out[0].prompt, conv)
        # A second turn carries the first; a batch of conversations keeps its order.
        conv2 = conv + [{"role": "assistant", "content": reply.text}, {"role": "user", "content": prompt()}]
        two = self.llm.chat([conv2, conv], sp)
        self.assertEqual(two[1].outputs[0].token_ids, reply.token_ids)
        self.assertGreater(two[0].num_prompt_tokens, out[0].num_prompt_tokens)
        thinking = self.llm.chat(conv, sp, thinking=True)[0]
        self.assertNotEqual(thinking.num_prompt_tokens, 0)

    def test_errors_are_exceptions(self):
        with self.assertRaises(DeepInferError) as e:
            self.llm.generate(prompt(), SamplingParams(temperature=-1.0))
        self.assertIn("temperature", str(e.exception))
        with self.assertRaises(DeepInferError) as e:
            self.llm.chat([{"role": "wizard", "content": "x"}])
        self.assertIn("role", str(e.exception))
        with self.assertRaises(DeepInferError) as e:
            LLM(model="/nonexistent/model/dir")
        self.assertIn("/nonexistent/model/dir", str(e.exception))
        with self.assertRaises(DeepInferError):
            LLM(model=MODEL, prefix_cache="sometimes")
        with self.assertRaises(TypeError):
            self.llm.generate([3.5])
        # The engine keeps serving after errors.
        again = self.llm.generate(prompt(), SamplingParams(max_tokens=2, ignore_eos=True))
        self.assertEqual(len(again[0].outputs[0].token_ids), 2)

    def test_gil_released_while_generating(self):
        done = threading.Event()
        outs = []
        sp = SamplingParams(max_tokens=60, temperature=0, ignore_eos=True)
        worker = threading.Thread(target=lambda: (outs.extend(self.llm.generate([prompt()] * 4, sp)), done.set()))
        ticks = 0
        worker.start()
        while not done.is_set():
            ticks += 1  # runs only while generate() has released the GIL
            time.sleep(0.001)
        worker.join()
        self.assertEqual(len(outs), 4)
        self.assertGreater(ticks, 3)

    def test_default_model_and_modes(self):
        # fast_fp4_gemm: a CUDA option that the CPU backend accepts and ignores
        llm = LLM(prefix_cache="exact", batch_invariant=True, async_scheduling=False, fast_fp4_gemm=True)
        out = llm.generate([prompt(), prompt()], SamplingParams(max_tokens=3, temperature=0, ignore_eos=True))
        self.assertEqual([len(o.outputs[0].token_ids) for o in out], [3, 3])
        # the engine publishes its stats after a step: they may trail the results for a moment
        deadline = time.monotonic() + 5
        while llm.stats()["generated_tokens"] < 6 and time.monotonic() < deadline:
            time.sleep(0.01)
        self.assertEqual(llm.stats()["generated_tokens"], 6)


if __name__ == "__main__":
    unittest.main(verbosity=2)

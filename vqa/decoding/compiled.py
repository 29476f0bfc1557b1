"""torch.compile for inference: the decode step (`vqa.decoding.batch.decode_step`) and, where it pays, the image
encoder, with the model's weights frozen into the compiled code.

Freezing (inductor's `freezing`) turns the weights into constants of the compiled code: on a CPU they are
prepacked for oneDNN / MKL, and int8 weights (`vqa.decoding.precision`) run oneDNN's int8 kernels -- eagerly torchao's
int8 matmuls are slower than float32 ones. So compile only a model whose weights no longer change (a Predictor,
not a model in training). Compiling takes seconds per new batch shape (batches are padded to a power of two
rows, so a few static shapes serve all); where the compiler itself cannot run (no C++ compiler for inductor's
CPU code, say), a warning says so and decoding runs eagerly.

The image encoder is compiled with the step (`compile=True`): it paid everywhere it was measured, CUDA, int8 on a
CPU and float32 on a CPU too. Inside the compiled step a decode's one query per row
attends through written-out products and sums that inductor fuses (`_one_query_attention`), and after a batch
shape's first call only the guards that tell its graphs apart are evaluated (`SKIP_GUARDS`).
"""

from __future__ import annotations

import threading
import warnings
import weakref
from collections.abc import Callable

import torch
from torch import nn

from .precision import is_int8


def _compile_errors() -> tuple[type[Exception], ...]:
    """What torch.compile raises when it cannot build the code (before anything ran)."""
    import torch._dynamo.exc
    import torch._inductor.exc as ie

    return (torch._dynamo.exc.BackendCompilerFailed, ie.InductorError, ie.CppCompileError, ie.InvalidCxxCompiler)


# inductor's settings while compiling (read when a graph is compiled, which can be any call). On a CPU,
# max_autotune with inductor's C++ GEMM template: for the decode step's small matmuls a generated kernel beats a
# call into MKL; it costs seconds more compiling, once per batch shape.
INDUCTOR = {"freezing": True}
INDUCTOR_CPU = {**INDUCTOR, "max_autotune": True, "max_autotune_gemm_backends": "CPP,ATEN",
                "autotune_num_choices_displayed": 0, "max_autotune_report_choices_stats": False}  # no tables on stderr


SKIP_GUARDS = True  # after a shape's first call, evaluate only the guards that tell its graphs apart
RECOMPILE_LIMIT = 64  # graphs per compiled function (torch's default, 8, is a few batch shapes of one model)


def bucket(rows: int) -> int:
    """The batch size a compiled graph runs at for `rows` rows: the next power of two, so a few static shapes
    serve every batch (a graph compiled for fixed shapes runs faster than one for a dynamic batch)."""
    return 1 << (rows - 1).bit_length()


# int8 graphs run at least two rows. For a one-row batch inductor may hand `_int_mm` a [1, K] activation whose row
# stride is 0 (any stride is valid for a size-1 dim); PyTorch's CPU `_int_mm` passes that stride to oneDNN's gemm
# as the leading dimension on CPUs with AVX512-VNNI or AMX, oneDNN rejects it, and the output is never written
# (pytorch/pytorch#195066): garbage logits. Two rows have a row stride of K on every CPU.
INT8_MIN_ROWS = 2


class CompiledStep:
    """A decode step, `step` (`vqa.decoding.batch.decode_step`), compiled for one model, with its cache buffers
    (made by `allocate`, `CacheBuffers.allocate`) pooled per (batch, slots): a decoding takes buffers from the pool
    and gives them back, so the compiled graph (and a CUDA graph) always sees the tensors it was captured with.
    One decoding at a time per model (a lock). `batch(rows)`: the rows a graph runs at."""

    POOL = 16  # buffer shapes kept per model: a bucket of rows each (and its dtype), so none is evicted in practice

    def __init__(self, decoder: nn.Module, step: Callable, allocate: Callable):
        import torch._inductor.config  # noqa: F401 (patched around each call)

        self.cfg = decoder.cfg  # no reference to the decoder itself: the cache of these is keyed weakly by it
        self.step, self.allocate = step, allocate
        self.min_rows = INT8_MIN_ROWS if is_int8(decoder) else 1
        self.cuda = next(decoder.parameters()).device.type == "cuda"
        options = {"triton.cudagraphs": True} if self.cuda else {}  # CUDA: the step replays as one CUDA graph
        # dynamic=False: one graph per batch shape (generate pads batches to a few sizes); a graph for a dynamic
        # batch size runs slower than static graphs of batches padded to a power of two
        self.fn = torch.compile(step, fullgraph=True, dynamic=False, options=options)
        self.lock = threading.Lock()
        self.failed: str | None = None  # why compiling failed (then every step runs eagerly)
        self._buffers: dict[tuple, tuple] = {}  # (CacheBuffers, the pooled image keys/values or None)
        self._compiled_shapes: set[tuple] = set()

    def batch(self, rows: int) -> int:
        """The rows a graph runs at for `rows` rows: `bucket(rows)`, at least `min_rows`."""
        return max(self.min_rows, bucket(rows))

    def buffers(self, batch: int, slots: int, dtype, device, memory_kv) -> tuple:
        """Reset buffers for `batch` rows and `slots` slots, and the image keys/values the steps read: on CUDA a
        pooled copy of `memory_kv` (a CUDA graph reads its inputs from fixed addresses), else `memory_kv`."""
        n = memory_kv[0][0].shape[2]
        key = (batch, slots, n, dtype, str(device))
        if key not in self._buffers:
            if len(self._buffers) >= self.POOL:
                self._buffers.pop(next(iter(self._buffers)))
            cache = self.allocate(self.cfg, batch, slots, dtype, device)
            kv = None
            if self.cuda:  # CUDA graphs read and write these in place: their addresses must not change
                kv = [(torch.empty_like(k), torch.empty_like(v)) for k, v in memory_kv]
                for t in (*cache.tensors(), *(x for pair in kv for x in pair)):
                    torch._dynamo.mark_static_address(t)
            self._buffers[key] = (cache, kv)
        cache, kv = self._buffers[key]
        cache.reset()
        if kv is None:
            return cache, memory_kv
        for (k, v), (k_new, v_new) in zip(kv, memory_kv, strict=True):
            k.copy_(k_new)
            v.copy_(v_new)
        return cache, kv

    def __call__(self, decoder, head, tokens, cache, memory_kv) -> torch.Tensor:
        args = (decoder, head, tokens, cache.pos, cache.slot, cache.key_valid, cache.k, cache.v, memory_kv)
        if self.failed is None:
            if self.cuda:
                torch.compiler.cudagraph_mark_step_begin()
            # inductor's settings must be in place whenever a graph is compiled (dynamo reads `freezing` while
            # tracing), but patching them costs more than a whole step: only the first call of each kind of input
            # (shapes, and the global state dynamo guards on), which is when torch.compile (re)compiles, runs
            # under them. A recompile this misses would give an unfrozen graph: slower, the same results.
            shapes = (cache.batch, cache.slots, memory_kv[0][0].shape[2], None if head is None else head.shape[0],
                      cache.k[0].dtype, tokens.is_inference(), torch.is_grad_enabled(),
                      torch.is_autocast_enabled(tokens.device.type),
                      torch._C._len_torch_function_stack())  # a TorchFunctionMode (a profiler, a counter) retraces
            try:
                if shapes in self._compiled_shapes:
                    # warmed up for this kind of input: run only the guards that pick between its graphs (the
                    # full set reads every module attribute the step reads; docs/results/performance.md times both)
                    with torch.compiler.set_stance(skip_guard_eval_unsafe=SKIP_GUARDS):
                        logits = self.fn(*args)
                else:
                    with torch._inductor.config.patch(INDUCTOR if self.cuda else INDUCTOR_CPU), \
                            torch._dynamo.config.patch(recompile_limit=RECOMPILE_LIMIT):
                        logits = self.fn(*args)
                    self._compiled_shapes.add(shapes)
                # a CUDA graph's output is overwritten by its next replay
                return logits.clone() if self.cuda else logits
            except _compile_errors() as e:
                # compiling happens before the step runs: nothing was written yet, the eager step can take over
                self.failed = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                warnings.warn(f"the compiled decode step could not be built ({self.failed}); decoding eagerly",
                              RuntimeWarning, stacklevel=2)
        return self.step(*args)


_compiled: weakref.WeakKeyDictionary[nn.Module, CompiledStep] = weakref.WeakKeyDictionary()
_compiled_lock = threading.Lock()


def step_of(decoder: nn.Module, step: Callable, allocate: Callable) -> CompiledStep:
    """The CompiledStep of `decoder`, made on first use from `step` and `allocate` (compilation itself happens on
    the first step of each new batch shape)."""
    with _compiled_lock:
        compiled = _compiled.get(decoder)
        if compiled is None:
            compiled = _compiled[decoder] = CompiledStep(decoder, step, allocate)
        return compiled


class CompiledEncoder:
    """`model.encode` compiled (weights frozen in) for image batches padded to a power of two, falling back to
    the eager encoder if compiling fails."""

    def __init__(self, model: nn.Module):
        import torch._inductor.config  # noqa: F401

        self.fn = torch.compile(type(model).encode, dynamic=False)  # unbound: no reference to the model, the key
        self.failed: str | None = None

    def __call__(self, model: nn.Module, images: torch.Tensor) -> torch.Tensor:
        if self.failed is None:
            m = images.shape[0]
            fill = bucket(m) - m
            if fill:  # [M, 3, S, S] -> [2^k, 3, S, S]: zero images, whose encodings are dropped
                images = torch.cat((images, images.new_zeros((fill, *images.shape[1:]))))
            try:
                with torch._inductor.config.patch(INDUCTOR), \
                        torch._dynamo.config.patch(recompile_limit=RECOMPILE_LIMIT):
                    return self.fn(model, images)[:m]
            except _compile_errors() as e:
                self.failed = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                warnings.warn(f"the compiled image encoder could not be built ({self.failed}); encoding eagerly",
                              RuntimeWarning, stacklevel=2)
                images = images[:m]
        return model.encode(images)


_encoders: weakref.WeakKeyDictionary[nn.Module, CompiledEncoder] = weakref.WeakKeyDictionary()


def encode(model: nn.Module, images: torch.Tensor, compile: bool = False) -> torch.Tensor:
    """model.encode(images) [M, N, D], through the compiled encoder when `compile` (faster on CUDA and on a CPU,
    float32 or int8: docs/results/performance.md has the figures)."""
    if not compile:
        return model.encode(images)
    with _compiled_lock:
        enc = _encoders.get(model)
        if enc is None:
            enc = _encoders[model] = CompiledEncoder(model)
    return enc(model, images)


__all__ = ["INDUCTOR", "INDUCTOR_CPU", "INT8_MIN_ROWS", "bucket", "CompiledStep", "step_of", "CompiledEncoder",
           "encode"]

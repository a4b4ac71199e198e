"""A Llama-shaped decode on SGLang's real Triton attention, as an audit / bench factory.

    warpolicy bench overlap --factory warpolicy.bench.llama:decode        # 16 layers
    warpolicy bench overlap --factory warpolicy.bench.llama:decode_deep   # 32 layers
    warpolicy audit --factory warpolicy.bench.llama:decode                # the same model, audited

The model (`LlamaDecode`, a `ModelAdapter`) is a Llama-3-8B-shaped decoder with random weights:
bf16, hidden 4096, 32 query heads over 8 KV heads of dimension 128 (grouped-query attention),
RMSNorm, rotary embeddings, a SiLU-gated MLP of 14336, a 32000-token LM head, and a paged KV
cache (one slot per token, ``req_to_token`` mapping request rows and positions to slots, as
SGLang's ``ReqToTokenPool``). Per decode step of one captured batch size:

* ``host_prep`` (before replay, forward stream): the batch's request rows, sequence lengths
  and input ids into the graph's static inputs (padding rows point at row 0, length 1);
* ``graph_prep`` (in the graph): SGLang's Triton backend's metadata, ``kv_indptr[1:bs+1] =
  cumsum(seq_lens)`` and ``create_flashinfer_kv_indices_triton[(bs,)](req_to_token,
  req_pool_indices, seq_lens, kv_indptr, None, kv_indices, req_to_token.stride(0))``: the only
  reads of scheduler-shared state (``req_to_token``), built in the graph here, so the in-graph
  read-done point follows SGLang's kernel;
* ``forward``: per layer, QKV projection, rotary, the KV write at ``out_cache_loc``,
  ``decode_attention_fwd`` (SGLang's grouped decode kernel, static ``max_kv_splits``) over the
  kv indices, output projection, MLP; then the final norm and the LM head (the logits are the
  step's output).

The kernels are loaded from the sha256-pinned SGLang wheel by `warpolicy.conformance.loader`
(``scripts/fetch-sglang-kernels`` first). The scheduler (``make_batch(mode, step)``) rewrites the
``req_to_token`` rows of step ``k``'s requests (half of them shared with step ``k - 1``) with
fresh slots from precomputed schedules, the new token's position pointing into a private slot
region that only the step itself writes and reads (``out_cache_loc``), so a step's output
depends on nothing but its own batch and the table rows the scheduler wrote for it: an
early-released write for step ``k + 1`` that lands before step ``k``'s kv-indices kernel changes
step ``k``'s logits (the race the benchmark's corrupted column counts).

`decode` and `decode_deep` need CUDA (one line and exit 2 otherwise, and without the kernel
files); `subject` builds any configuration (the CPU tests run a tiny float32 one on the
simulated platform through Triton's interpreter).
"""

from __future__ import annotations

import functools
from typing import Any

import attrs
import torch
import torch.nn.functional as F

from warpolicy import environment
from warpolicy.audit.subject import AuditSubject
from warpolicy.conformance.loader import KernelsUnavailable, SGLangKernels, load_kernels
from warpolicy.errors import CudaUnavailableError
from warpolicy.registry.decision import Context
from warpolicy.registry.engine import PolicyEngine
from warpolicy.registry.loader import default_registry_path
from warpolicy.registry.vocabulary import ForwardMode
from warpolicy.runtime.platforms import Platform
from warpolicy.runtime.runners import DecodeRunner

DECODE = ForwardMode.DECODE
#: The registry backend whose declaration the audit checks (SGLang's Triton backend).
BACKEND = "triton"


def _positive(_instance: object, attribute: attrs.Attribute, value: int) -> None:
    if value <= 0:
        raise ValueError(f"{attribute.name} must be positive, got {value}")


@attrs.frozen
class LlamaConfig:
    """Shapes of the model, its KV cache and its schedule (defaults: Llama 3 8B, 16 layers)."""

    layers: int = attrs.field(default=16, validator=_positive)
    q_heads: int = attrs.field(default=32, validator=_positive)
    kv_heads: int = attrs.field(default=8, validator=_positive)
    head_dim: int = attrs.field(default=128, validator=_positive)
    intermediate: int = attrs.field(default=14336, validator=_positive)
    vocab: int = attrs.field(default=32000, validator=_positive)
    batch: int = attrs.field(default=32, validator=_positive)  # the captured batch size
    context: int = attrs.field(default=1024, validator=_positive)  # positions per request row
    requests: int = attrs.field(default=64, validator=_positive)  # rows of req_to_token
    max_kv_splits: int = attrs.field(default=8, validator=_positive)
    schedules: int = attrs.field(default=16, validator=_positive)  # distinct step plans
    rope_theta: float = 500000.0
    rms_eps: float = 1e-5
    dtype: Any = torch.bfloat16
    seed: int = 0

    def __attrs_post_init__(self) -> None:
        if self.q_heads % self.kv_heads:
            raise ValueError("q_heads must be a multiple of kv_heads")
        if self.head_dim % 2:
            raise ValueError("head_dim must be even (rotary embeddings)")
        if self.batch > self.requests:
            raise ValueError("the batch holds more requests than the table has rows")

    @property
    def hidden(self) -> int:
        return self.q_heads * self.head_dim

    @property
    def old_slots(self) -> int:
        """Slots the table's history points at: ``1 .. old_slots`` (slot 0 is the sink)."""
        return self.requests * self.context

    @property
    def new_base(self) -> int:
        """The first slot of the private region the step's new tokens write (and read)."""
        return self.old_slots + 1

    @property
    def slots(self) -> int:
        return self.new_base + self.batch


class _Bucket:
    """One captured batch size's static inputs, metadata buffers and output."""

    def __init__(self, bs: int, cfg: LlamaConfig, device: torch.device) -> None:
        z64 = functools.partial(torch.zeros, dtype=torch.int64, device=device)
        self.bs = bs
        self.req_pool_indices = z64(bs)  # padding: row 0
        self.seq_lens = torch.ones(bs, dtype=torch.int32, device=device)  # padding: length 1
        self.input_ids = z64(bs)
        self.out_cache_loc = torch.arange(bs, dtype=torch.int64, device=device) + cfg.new_base
        self.kv_indptr = torch.zeros(bs + 1, dtype=torch.int32, device=device)
        self.kv_indices = z64(bs * cfg.context)
        heads, splits, hd = cfg.q_heads, cfg.max_kv_splits, cfg.head_dim
        self.attn_logits = torch.zeros(bs, heads, splits, hd, dtype=torch.float32, device=device)
        self.attn_lse = torch.zeros(bs, heads, splits, dtype=torch.float32, device=device)
        self.num_kv_splits = torch.full((bs,), splits, dtype=torch.int32, device=device)
        self.o = torch.zeros(bs, heads, hd, dtype=cfg.dtype, device=device)
        self.logits = torch.zeros(bs, cfg.vocab, dtype=cfg.dtype, device=device)


class LlamaDecode:
    """The `ModelAdapter` of the Llama-shaped decode (see the module docstring)."""

    def __init__(self, cfg: LlamaConfig, kernels: SGLangKernels, device: Any) -> None:
        self.cfg = cfg
        self.kernels = kernels
        self.device = torch.device(device)
        dev, dtype = self.device, cfg.dtype
        gen = torch.Generator(device=dev).manual_seed(cfg.seed)

        def weight(rows: int, cols: int) -> torch.Tensor:
            w = torch.randn(rows, cols, generator=gen, device=dev, dtype=dtype)
            return w.mul_(rows**-0.5)

        hidden, qkv = cfg.hidden, (cfg.q_heads + 2 * cfg.kv_heads) * cfg.head_dim
        self.embed = torch.randn(cfg.vocab, hidden, generator=gen, device=dev, dtype=dtype)
        self.attn_norm = [torch.ones(hidden, device=dev, dtype=dtype) for _ in range(cfg.layers)]
        self.mlp_norm = [torch.ones(hidden, device=dev, dtype=dtype) for _ in range(cfg.layers)]
        self.wqkv = [weight(hidden, qkv) for _ in range(cfg.layers)]
        self.wo = [weight(hidden, hidden) for _ in range(cfg.layers)]
        self.w_gate_up = [weight(hidden, 2 * cfg.intermediate) for _ in range(cfg.layers)]
        self.w_down = [weight(cfg.intermediate, hidden) for _ in range(cfg.layers)]
        self.final_norm = torch.ones(hidden, device=dev, dtype=dtype)
        self.lm_head = weight(hidden, cfg.vocab)
        # rotary tables by position (float32)
        half = cfg.head_dim // 2
        inv = cfg.rope_theta ** (-torch.arange(half, device=dev, dtype=torch.float32) / half)
        angles = torch.arange(cfg.context, device=dev, dtype=torch.float32)[:, None] * inv
        self.cos, self.sin = angles.cos(), angles.sin()
        # the paged KV cache: [layers, slots, kv_heads, head_dim], slot 0 the sink
        shape = (cfg.layers, cfg.slots, cfg.kv_heads, cfg.head_dim)
        self.k_cache = torch.randn(shape, generator=gen, device=dev, dtype=dtype)
        self.v_cache = torch.randn(shape, generator=gen, device=dev, dtype=dtype)
        # scheduler-shared: request row x position -> slot (int32, row 0 the padding row)
        table = torch.randint(
            1, cfg.old_slots + 1, (cfg.requests + 1, cfg.context), generator=gen, device=dev
        )
        table[0].zero_()
        self.req_to_token = table.to(torch.int32)
        self.shared_buffers = {"req_to_token": self.req_to_token}
        #: what a step writes besides its logits: the new tokens' KV slots
        self.extra_outputs = {
            "k_new": self.k_cache[:, cfg.new_base :],
            "v_new": self.v_cache[:, cfg.new_base :],
        }
        self._plan(gen)
        self.static: dict[int, _Bucket] = {}

    def _plan(self, gen: torch.Generator) -> None:
        """Precomputed step plans (on the device: the scheduler's writes need no host work)."""
        cfg, dev = self.cfg, self.device
        n, p = cfg.batch, cfg.schedules
        self._lens = torch.randint(1, cfg.context + 1, (p, n), generator=gen, device=dev)
        self._ids = torch.randint(0, cfg.vocab, (p, n), generator=gen, device=dev)
        fresh = torch.randint(1, cfg.old_slots + 1, (p, n, cfg.context), generator=gen, device=dev)
        # the new token (position seq_len - 1) is the step's own private slot
        new = torch.arange(n, device=dev) + cfg.new_base
        fresh.scatter_(2, (self._lens - 1)[:, :, None], new.expand(p, n)[:, :, None])
        self._fresh = fresh.to(torch.int32)
        self._arange = torch.arange(n, device=dev)

    # -- ModelAdapter ------------------------------------------------------------------------

    def bucket_sizes(self, mode: ForwardMode) -> tuple[int, ...]:
        return (self.cfg.batch,) if ForwardMode.parse(mode) is DECODE else ()

    def batch_size(self, batch: torch.Tensor) -> int:
        return int(batch.shape[0])

    def prepare_bucket(self, bucket: int) -> None:
        if bucket not in self.static:
            if bucket > self.cfg.batch:
                raise ValueError(
                    f"batch size {bucket} exceeds the new-token region of {self.cfg.batch}"
                )
            self.static[bucket] = _Bucket(bucket, self.cfg, self.device)

    def host_prep(self, batch: torch.Tensor, bucket: int) -> None:
        """SGLang's ``replay_prepare``: the batch into the static inputs, padded."""
        s = self.static[bucket]
        n = int(batch.shape[0])
        s.req_pool_indices[:n].copy_(batch[:, 0])
        s.req_pool_indices[n:].zero_()
        s.seq_lens[:n].copy_(batch[:, 1])
        s.seq_lens[n:].fill_(1)
        s.input_ids[:n].copy_(batch[:, 2])
        s.input_ids[n:].zero_()

    def graph_prep(self, bucket: int) -> None:
        """SGLang's Triton decode metadata, in the graph: the reads of ``req_to_token``."""
        s = self.static[bucket]
        s.kv_indptr[1 : bucket + 1] = torch.cumsum(s.seq_lens, dim=0)
        self.kernels.create_flashinfer_kv_indices_triton[(bucket,)](
            self.req_to_token,
            s.req_pool_indices,
            s.seq_lens,
            s.kv_indptr,
            None,
            s.kv_indices,
            self.req_to_token.stride(0),
        )

    def forward(self, bucket: int) -> torch.Tensor:
        s, cfg = self.static[bucket], self.cfg
        qd, kd = cfg.q_heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim
        positions = (s.seq_lens - 1).to(torch.int64)
        cos = self.cos.index_select(0, positions)[:, None, :]
        sin = self.sin.index_select(0, positions)[:, None, :]
        h = self.embed.index_select(0, s.input_ids)
        for layer in range(cfg.layers):
            x = rms_norm(h, self.attn_norm[layer], cfg.rms_eps)
            qkv = x @ self.wqkv[layer]
            q = rotary(qkv[:, :qd].view(bucket, cfg.q_heads, cfg.head_dim), cos, sin)
            k = rotary(qkv[:, qd : qd + kd].view(bucket, cfg.kv_heads, cfg.head_dim), cos, sin)
            v = qkv[:, qd + kd :].view(bucket, cfg.kv_heads, cfg.head_dim)
            k_buffer, v_buffer = self.k_cache[layer], self.v_cache[layer]
            k_buffer[s.out_cache_loc] = k  # set_kv_buffer
            v_buffer[s.out_cache_loc] = v
            self.kernels.decode_attention_fwd(
                q, k_buffer, v_buffer, s.o, s.kv_indptr, s.kv_indices, s.attn_logits,
                s.attn_lse, s.num_kv_splits, cfg.max_kv_splits, cfg.head_dim**-0.5, 1.0, 1.0,
            )  # fmt: skip
            h = h + s.o.view(bucket, qd) @ self.wo[layer]
            x = rms_norm(h, self.mlp_norm[layer], cfg.rms_eps)
            gate, up = (x @ self.w_gate_up[layer]).chunk(2, dim=-1)
            h = h + (F.silu(gate) * up) @ self.w_down[layer]
        torch.matmul(rms_norm(h, self.final_norm, cfg.rms_eps), self.lm_head, out=s.logits)
        return s.logits

    # -- the scheduler ---------------------------------------------------------------------------

    def make_batch(self, mode: ForwardMode, step: int) -> torch.Tensor:
        """Step ``step``'s batch ``[batch, 3]`` (request row, sequence length, input id), after
        rewriting its requests' ``req_to_token`` rows: the scheduler's next-batch writes, on the
        current stream, device work only."""
        cfg = self.cfg
        p = step % cfg.schedules
        rows = (self._arange + step * max(cfg.batch // 2, 1)) % cfg.requests + 1
        self.req_to_token.index_copy_(0, rows, self._fresh[p])
        return torch.stack((rows, self._lens[p], self._ids[p]), dim=1)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return (x32 * weight.float()).to(x.dtype)


def rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embeddings (the rotate-half form) of ``x`` ``[tokens, heads, head_dim]``."""
    half = x.shape[-1] // 2
    x32 = x.float()
    x1, x2 = x32[..., :half], x32[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)


def reference_logits(model: LlamaDecode, batch: torch.Tensor) -> torch.Tensor:
    """The step computed eagerly in plain torch from the table (no kernel of SGLang's), on a
    copy of the KV cache: what the numerics test compares the model's logits with."""
    cfg = model.cfg
    rows, lens, ids = batch[:, 0], batch[:, 1], batch[:, 2]
    n = int(batch.shape[0])
    qd, kd = cfg.q_heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim
    groups = cfg.q_heads // cfg.kv_heads
    loc = torch.arange(n, device=model.device) + cfg.new_base
    k_cache, v_cache = model.k_cache.clone(), model.v_cache.clone()
    cos = model.cos.index_select(0, lens - 1)[:, None, :]
    sin = model.sin.index_select(0, lens - 1)[:, None, :]
    h = model.embed.index_select(0, ids)
    for layer in range(cfg.layers):
        x = rms_norm(h, model.attn_norm[layer], cfg.rms_eps)
        qkv = x @ model.wqkv[layer]
        q = rotary(qkv[:, :qd].view(n, cfg.q_heads, cfg.head_dim), cos, sin)
        k = rotary(qkv[:, qd : qd + kd].view(n, cfg.kv_heads, cfg.head_dim), cos, sin)
        k_cache[layer][loc] = k
        v_cache[layer][loc] = qkv[:, qd + kd :].view(n, cfg.kv_heads, cfg.head_dim)
        outs = []
        for i in range(n):
            slots = model.req_to_token[int(rows[i]), : int(lens[i])].to(torch.int64)
            keys, values = k_cache[layer][slots].float(), v_cache[layer][slots].float()
            qi = q[i].float().view(cfg.kv_heads, groups, cfg.head_dim)
            scores = torch.einsum("kgd,skd->kgs", qi, keys) * cfg.head_dim**-0.5
            outs.append(torch.einsum("kgs,skd->kgd", scores.softmax(-1), values).reshape(-1))
        h = h + torch.stack(outs).to(cfg.dtype) @ model.wo[layer]
        x = rms_norm(h, model.mlp_norm[layer], cfg.rms_eps)
        gate, up = (x @ model.w_gate_up[layer]).chunk(2, dim=-1)
        h = h + (F.silu(gate) * up) @ model.w_down[layer]
    return rms_norm(h, model.final_norm, cfg.rms_eps) @ model.lm_head


# -- factories ---------------------------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def default_engine() -> PolicyEngine:
    """The packaged default registry, no environment flags (the declaration audited is the
    registry's own, whatever the shell exports)."""
    return PolicyEngine.load([str(default_registry_path())], environ={})


def subject(
    platform: Platform,
    config: LlamaConfig | None = None,
    *,
    kernels: SGLangKernels | None = None,
    name: str = "llama-decode",
) -> AuditSubject:
    """The `AuditSubject` of a Llama-shaped decode of ``config`` on ``platform``, declared and
    compiled by the default registry as SGLang's ``triton`` backend.

    On CUDA it runs on the platform's device; elsewhere only with Triton's interpreter
    (``TRITON_INTERPRET=1``, CPU tensors: float32 configurations), else `CudaUnavailableError`.
    Missing or altered kernel files: `KernelsUnavailable` (one line naming the fetch script).
    """
    on_cuda = platform.name == "cuda"
    if not on_cuda and environment.TRITON_INTERPRET.get() != "1":
        raise CudaUnavailableError(
            "the Llama-shaped decode runs SGLang's Triton kernels on a CUDA device; on platform "
            f"{platform.name!r} only through Triton's interpreter (TRITON_INTERPRET=1, tiny "
            "float32 configurations)"
        )
    config = config or LlamaConfig()
    kernels = kernels if kernels is not None else load_kernels()
    device = torch.device(platform.device) if on_cuda else torch.device("cpu")
    model = LlamaDecode(config, kernels, device)
    engine = default_engine()
    policy = engine.compile(
        BACKEND,
        "none",
        platform=platform.name,
        external_events=platform.external_events_supported(),
        strict=True,
    )

    def runner(m: Any) -> DecodeRunner:
        return DecodeRunner(m, policy, platform, f"{name}:decode", keep_graphs=True)

    return AuditSubject(
        name=name,
        model=model,
        runners={DECODE: runner},
        make_batch=model.make_batch,
        platform=platform,
        declared={DECODE: engine.decide(Context(BACKEND, DECODE, "none"))},
        spec="none",
        extra_outputs=model.extra_outputs,
    )


def _cuda_only(platform: Platform, what: str) -> None:
    if platform.name != "cuda":
        raise CudaUnavailableError(
            f"warpolicy.bench.llama:{what} is a full-size model for a CUDA device (platform "
            f"{platform.name!r}); warpolicy.bench.llama.subject builds small configurations"
        )


def decode(platform: Platform) -> AuditSubject:
    """16 layers, batch 32, context up to 1024: the benchmark's default."""
    _cuda_only(platform, "decode")
    return subject(platform, LlamaConfig(layers=16))


def decode_deep(platform: Platform) -> AuditSubject:
    """32 layers (the full Llama 3 8B depth), batch 32."""
    _cuda_only(platform, "decode_deep")
    return subject(platform, LlamaConfig(layers=32), name="llama-decode-32")


__all__ = [
    "BACKEND",
    "KernelsUnavailable",
    "LlamaConfig",
    "LlamaDecode",
    "decode",
    "decode_deep",
    "reference_logits",
    "rms_norm",
    "rotary",
    "subject",
]

"""Model FLOPs of one transformer call, counted from the architecture's config (used by
``benchmarks/gpu.py``; not a benchmark itself).

Only matrix products are counted (the linear layers, the patch-embedding convolution as the
matrix product it is, and the two products of every attention), 2 FLOPs per multiply-add, the
same operations ``torch.utils.flop_counter.FlopCounterMode`` counts; norms, activations, RoPE
and the modulation arithmetic are left out (under 1% at real sizes). The counts follow the
diffusers classes module by module (``SD3Transformer2DModel``, ``FluxTransformer2DModel``,
``WanTransformer3DModel`` in diffusers 0.42), including the small per-sample layers (timestep
and pooled-text embeddings, adaLN modulations).

The backward is counted as autograd runs it in LoRA training, not as the ``3x forward`` of
full fine-tuning: a frozen linear layer computes only its input's gradient (1x its forward)
and none at all while its input needs no gradient (the layers before the first LoRA, the
timestep embeddings and adaLN modulations, Wan's text keys and values); a LoRA factor computes
its weight's gradient too; an attention's backward is the 4 products of ``dV, dP, dQ, dK``
(2x its forward) when all of q, k, v need gradients. A gradient-checkpointing recompute is a
second forward the hardware runs, not a model FLOP: it is not counted (the usual MFU
convention). ``tests/benchmarks/test_gpu_bench.py`` checks the counts against
``FlopCounterMode`` on the tiny models, forward and forward + backward with a LoRA.
"""

from __future__ import annotations

from dataclasses import dataclass, field


def lora_applies(name: str, targets: tuple[str, ...]) -> bool:
    """peft's matching of ``target_modules`` names: the module's full name, or a suffix of it
    after a dot (``attn.to_q`` matches ``transformer_blocks.0.attn.to_q``, not ``attn2.to_q``)."""
    return any(name == t or name.endswith("." + t) for t in targets)


@dataclass
class Count:
    """FLOPs of a forward and of the backward autograd runs after it, added layer by layer.

    Each layer method takes whether its inputs need gradients and returns whether its output
    does, so the caller threads that through the model as autograd would."""

    lora_rank: int = 0
    lora_targets: tuple[str, ...] = ()
    forward: float = 0.0
    backward: float = 0.0
    by_kind: dict[str, float] = field(default_factory=dict)  # forward FLOPs per kind

    def _add(self, kind: str, forward: float, backward: float) -> None:
        self.forward += forward
        self.backward += backward
        self.by_kind[kind] = self.by_kind.get(kind, 0.0) + forward

    def linear(self, name: str, tokens: int, d_in: int, d_out: int, x_grad: bool) -> bool:
        """A frozen ``nn.Linear`` (or a patch convolution) on ``tokens`` rows, with a LoRA of
        ``lora_rank`` when ``name`` is a target."""
        base = 2.0 * tokens * d_in * d_out
        self._add("linear", base, base if x_grad else 0.0)
        if not (self.lora_rank and lora_applies(name, self.lora_targets)):
            return x_grad
        a = 2.0 * tokens * d_in * self.lora_rank  # lora_A: d_in -> r
        b = 2.0 * tokens * self.lora_rank * d_out  # lora_B: r -> d_out
        # A: its weight's gradient (+ its input's when that needs one); B: weight and input
        self._add("lora", a + b, a * (1 + x_grad) + 2 * b)
        return True

    def attention(self, rows: int, heads: int, s_q: int, s_k: int, head_dim: int,
                  q_grad: bool, k_grad: bool, v_grad: bool) -> bool:
        """``softmax(q k^T) v`` over ``rows`` samples: ``q k^T`` and ``p v`` forward; ``dV``,
        ``dP``, ``dQ``, ``dK`` backward, each only when some input needs it."""
        unit = 2.0 * rows * heads * s_q * s_k * head_dim  # one of the products
        backward = unit * (v_grad + (q_grad or k_grad) + q_grad + k_grad)
        self._add("attention", 2 * unit, backward)
        return q_grad or k_grad or v_grad

    def feed_forward(self, prefix: str, tokens: int, dim: int, inner: int, x_grad: bool) -> bool:
        """diffusers' ``FeedForward``: ``net.0.proj`` (dim -> inner) then ``net.2``."""
        hidden = self.linear(prefix + "net.0.proj", tokens, dim, inner, x_grad)
        return self.linear(prefix + "net.2", tokens, inner, dim, hidden)

    def mlp2(self, prefix: str, rows: int, d_in: int, dim: int) -> None:
        """Two linear layers on inputs that need no gradient (``TimestepEmbedding``,
        ``PixArtAlphaTextProjection``: ``linear_1``, ``linear_2``)."""
        self.linear(prefix + "linear_1", rows, d_in, dim, False)
        self.linear(prefix + "linear_2", rows, dim, dim, False)


def sd3(config: dict, rows: int, height: int, width: int, text_tokens: int,
        count: Count) -> Count:
    """``SD3Transformer2DModel`` on latents ``[rows, C, height, width]`` and ``text_tokens``
    prompt tokens (SD3.5: 77 CLIP + 256 T5 = 333)."""
    c = config
    heads, head_dim, p = c["num_attention_heads"], c["attention_head_dim"], c["patch_size"]
    dim = heads * head_dim
    n_img, n_txt = (height // p) * (width // p), text_tokens
    layers, dual = c["num_layers"], set(c.get("dual_attention_layers", ()))
    count.linear("pos_embed.proj", rows * n_img, c["in_channels"] * p * p, dim, False)
    count.mlp2("time_text_embed.timestep_embedder.", rows, 256, dim)
    count.mlp2("time_text_embed.text_embedder.", rows, c["pooled_projection_dim"], dim)
    count.linear("context_embedder", rows * n_txt, c["joint_attention_dim"],
                 c["caption_projection_dim"], False)
    img = txt = False
    for i in range(layers):
        pre, last, two = f"transformer_blocks.{i}.", i == layers - 1, i in dual
        count.linear(pre + "norm1.linear", rows, dim, (9 if two else 6) * dim, False)
        count.linear(pre + "norm1_context.linear", rows, dim, (2 if last else 6) * dim, False)
        q, k, v = (count.linear(pre + f"attn.to_{s}", rows * n_img, dim, dim, img)
                   for s in "qkv")
        tq, tk, tv = (count.linear(pre + f"attn.add_{s}_proj", rows * n_txt, dim, dim, txt)
                      for s in "qkv")
        attn = count.attention(rows, heads, n_img + n_txt, n_img + n_txt, head_dim,
                               q or tq, k or tk, v or tv)
        out = count.linear(pre + "attn.to_out.0", rows * n_img, dim, dim, attn)
        txt_out = False if last else count.linear(pre + "attn.to_add_out", rows * n_txt, dim,
                                                  dim, attn)
        out2 = False
        if two:  # SD3.5's second, image-only self-attention (MMDiT-X)
            q2, k2, v2 = (count.linear(pre + f"attn2.to_{s}", rows * n_img, dim, dim, img)
                          for s in "qkv")
            attn2 = count.attention(rows, heads, n_img, n_img, head_dim, q2, k2, v2)
            out2 = count.linear(pre + "attn2.to_out.0", rows * n_img, dim, dim, attn2)
        img = img or out or out2
        img = count.feed_forward(pre + "ff.", rows * n_img, dim, 4 * dim, img)
        if not last:
            txt = txt or txt_out
            txt = count.feed_forward(pre + "ff_context.", rows * n_txt, dim, 4 * dim, txt)
    count.linear("norm_out.linear", rows, dim, 2 * dim, False)
    count.linear("proj_out", rows * n_img, dim, p * p * c["out_channels"], img)
    return count


def flux(config: dict, rows: int, image_tokens: int, text_tokens: int, count: Count) -> Count:
    """``FluxTransformer2DModel`` on ``image_tokens`` packed latent tokens (``(H/16)(W/16)``)
    and ``text_tokens`` T5 tokens (FLUX.1-dev: 512)."""
    c = config
    heads, head_dim = c["num_attention_heads"], c["attention_head_dim"]
    dim = heads * head_dim
    n_img, n_txt = image_tokens, text_tokens
    n = n_img + n_txt
    count.linear("x_embedder", rows * n_img, c["in_channels"], dim, False)
    count.mlp2("time_text_embed.timestep_embedder.", rows, 256, dim)
    if c.get("guidance_embeds"):
        count.mlp2("time_text_embed.guidance_embedder.", rows, 256, dim)
    count.mlp2("time_text_embed.text_embedder.", rows, c["pooled_projection_dim"], dim)
    count.linear("context_embedder", rows * n_txt, c["joint_attention_dim"], dim, False)
    img = txt = False
    for i in range(c["num_layers"]):
        pre = f"transformer_blocks.{i}."
        count.linear(pre + "norm1.linear", rows, dim, 6 * dim, False)
        count.linear(pre + "norm1_context.linear", rows, dim, 6 * dim, False)
        q, k, v = (count.linear(pre + f"attn.to_{s}", rows * n_img, dim, dim, img) for s in "qkv")
        tq, tk, tv = (count.linear(pre + f"attn.add_{s}_proj", rows * n_txt, dim, dim, txt)
                      for s in "qkv")
        attn = count.attention(rows, heads, n, n, head_dim, q or tq, k or tk, v or tv)
        img = count.linear(pre + "attn.to_out.0", rows * n_img, dim, dim, attn) or img
        txt = count.linear(pre + "attn.to_add_out", rows * n_txt, dim, dim, attn) or txt
        img = count.feed_forward(pre + "ff.", rows * n_img, dim, 4 * dim, img)
        txt = count.feed_forward(pre + "ff_context.", rows * n_txt, dim, 4 * dim, txt)
    both = img or txt  # the single-stream blocks run on [text; image]
    for i in range(c["num_single_layers"]):
        pre = f"single_transformer_blocks.{i}."
        count.linear(pre + "norm.linear", rows, dim, 3 * dim, False)
        mlp = count.linear(pre + "proj_mlp", rows * n, dim, 4 * dim, both)
        q, k, v = (count.linear(pre + f"attn.to_{s}", rows * n, dim, dim, both) for s in "qkv")
        attn = count.attention(rows, heads, n, n, head_dim, q, k, v)
        both = count.linear(pre + "proj_out", rows * n, 5 * dim, dim, attn or mlp) or both
    count.linear("norm_out.linear", rows, dim, 2 * dim, False)
    out_channels = c.get("out_channels") or c["in_channels"]
    count.linear("proj_out", rows * n_img, dim, c["patch_size"] ** 2 * out_channels, both)
    return count


def wan(config: dict, rows: int, frames: int, height: int, width: int, text_tokens: int,
        count: Count) -> Count:
    """``WanTransformer3DModel`` (text-to-video, no image branch) on latents
    ``[rows, C, frames, height, width]`` and ``text_tokens`` umT5 tokens (512)."""
    c = config
    heads, head_dim = c["num_attention_heads"], c["attention_head_dim"]
    dim = heads * head_dim
    pt, ph, pw = c["patch_size"]
    n = (frames // pt) * (height // ph) * (width // pw)
    n_txt = text_tokens
    count.linear("patch_embedding", rows * n, c["in_channels"] * pt * ph * pw, dim, False)
    count.mlp2("condition_embedder.time_embedder.", rows, c["freq_dim"], dim)
    count.linear("condition_embedder.time_proj", rows, dim, 6 * dim, False)
    count.linear("condition_embedder.text_embedder.linear_1", rows * n_txt, c["text_dim"], dim,
                 False)
    count.linear("condition_embedder.text_embedder.linear_2", rows * n_txt, dim, dim, False)
    x = False
    for i in range(c["num_layers"]):
        pre = f"blocks.{i}."
        q, k, v = (count.linear(pre + f"attn1.to_{s}", rows * n, dim, dim, x) for s in "qkv")
        attn = count.attention(rows, heads, n, n, head_dim, q, k, v)
        x = count.linear(pre + "attn1.to_out.0", rows * n, dim, dim, attn) or x
        q = count.linear(pre + "attn2.to_q", rows * n, dim, dim, x)
        k, v = (count.linear(pre + f"attn2.to_{s}", rows * n_txt, dim, dim, False) for s in "kv")
        attn = count.attention(rows, heads, n, n_txt, head_dim, q, k, v)
        x = count.linear(pre + "attn2.to_out.0", rows * n, dim, dim, attn) or x
        x = count.feed_forward(pre + "ffn.", rows * n, dim, c["ffn_dim"], x)
    out_channels = c.get("out_channels") or c["in_channels"]
    count.linear("proj_out", rows * n, dim, out_channels * pt * ph * pw, x)
    return count


def call_flops(family: str, config: dict, hidden_shape: tuple[int, ...], text_tokens: int,
               lora_rank: int = 0, lora_targets: tuple[str, ...] = ()) -> Count:
    """The count of one call of ``family``'s transformer (``sd3``, ``flux`` or ``wan``) on
    ``hidden_states`` of ``hidden_shape`` (its batch is the call's rows)."""
    count = Count(lora_rank, tuple(lora_targets))
    rows = hidden_shape[0]
    if family == "sd3":
        return sd3(config, rows, hidden_shape[2], hidden_shape[3], text_tokens, count)
    if family == "flux":
        return flux(config, rows, hidden_shape[1], text_tokens, count)
    if family == "wan":
        return wan(config, rows, *hidden_shape[2:5], text_tokens, count)
    raise ValueError(f"no FLOP count for family {family!r}; valid: sd3, flux, wan")

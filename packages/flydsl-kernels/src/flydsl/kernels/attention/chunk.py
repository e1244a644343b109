"""One warp's step of the paged decode kernel (:mod:`.decode`): 16 tokens' scores, the online softmax update and
``O^T += V^T P^T``, on the registers the kernel loaded.

Two layouts of the scores (``mma.sync`` m16n8k16, float32 accumulators):

* ``S = Q K^T`` (more than 8 query rows): Q is the 16-row A operand, the chunk's keys the B operand of two n8 tiles
  (tokens ``0..7``, ``8..15``). A lane holds rows g and g + 8, tokens ``2c + {0, 1}`` (+ 8): the C fragments of S
  are the B fragments of ``P^T`` as they stand.
* ``S^T = K Q^T`` (at most 8 rows, ``cfg.narrow``: groups of up to 8 query heads, Llama-3's 4 and 8, values
  not scaled per token): the keys are the A operand (tokens g and g + 8) and Q^T the B operand: one MMA per k16 step
  instead of two, and no zero rows in Q's A fragments (which the compiler rebuilt around one zero register every
  chunk). A lane holds tokens g, g + 8 of query rows ``2c + {0, 1}``; P packed per token is an 8x8 fragment of
  ``P^T`` that ``movmatrix`` transposes into the B fragment of ``P^T``.

Both take the head dimension in the permuted order of the 16-byte loads (a dot product does not care; Q's fragments
are loaded in the same order). A row's running maximum moves only when a chunk passes it by more than
``cfg.rescale_slack`` (base 2) in some row of the warp; otherwise P stays below ``2^slack`` and the accumulators keep
their scale: most chunks skip the rescaling.
"""

from __future__ import annotations

import flydsl.expr as fx
from flydsl.expr import arith, math, nvvm, vector
from flydsl.expr.vector import Vector

CHUNK = 16  # tokens per warp step: the K of one P V MMA
LOG2E = 1.4426950408889634
ACC = Vector.of(fx.Float32, 4)
W2 = Vector.of(fx.Int32, 2)
W4 = Vector.of(fx.Int32, 4)


def chunk_step(cfg, state, loaded, queries, chunk, consts):
    """One chunk. ``state``: ``[row_max(2), row_sum(2), acc(D/16 x p_tiles)]`` for the lane's rows g and g + 8 of
    the row tile (narrow: rows 2c and 2c + 1); ``loaded``: what the kernel's ``_load_chunk`` returned; ``queries``:
    Q's fragments; ``consts``: ``(row_scale(2), cap, lows(2), highs(2), lane_g, lane_c)`` for the state's rows."""
    keys, values, *token_scales = loaded
    k_token_scales = token_scales[0] if cfg.k_scale == "token" else None
    v_token_scales = token_scales[-1] if cfg.v_scale == "token" else None
    row_scale, cap, lows, highs, lane_g, lane_c = consts
    row_max, row_sum, acc = state
    if fx.const_expr(cfg.narrow):
        s = ACC(0.0)
        for step in fx.range_constexpr(cfg.head_dim // 16):
            low, high = _key_fragment(cfg, keys, 0, step), _key_fragment(cfg, keys, 1, step)
            a = vector.from_elements(W4, [low[0], high[0], low[1], high[1]])
            s = nvvm.mma_sync(a, queries[step], s, dtype=cfg.mma_dtype("qk"))
        # row j (query row 2c + j): tokens g and g + 8 are elements j and 2 + j; its lanes are those of one c
        tokens = [chunk + lane_g, chunk + 8 + lane_g]
        row_logits = []
        for j in fx.range_constexpr(2):
            row_logits.append([_logit(cfg, s[2 * t + j], j, t, tokens[t], consts, k_token_scales) for t in range(2)])
        row_span = (4, 8, 16)
    else:
        scores = []
        for half in fx.range_constexpr(2):
            s = ACC(0.0)
            for step in fx.range_constexpr(cfg.head_dim // 16):
                s = nvvm.mma_sync(queries[step], _key_fragment(cfg, keys, half, step), s, dtype=cfg.mma_dtype("qk"))
            scores.append(s)
        # row r (g + 8r): element 2r + j of tile `half` is token 8 half + 2c + j; its lanes are those of one g
        rows = 2 if cfg.p_tiles == 2 else 1  # rows g + 8 are padding when a tile holds at most 8 rows
        row_logits = []
        for r in fx.range_constexpr(rows):
            logits = []
            for half in fx.range_constexpr(2):
                for j in fx.range_constexpr(2):
                    token = chunk + 8 * half + 2 * lane_c + j
                    logits.append(_logit(cfg, scores[half][2 * r + j], r, 2 * half + j, token, consts, k_token_scales))
            row_logits.append(logits)
        row_span = (1, 2)
    new_max, new_sum, alphas, probs, rescale = _online_softmax(
        cfg, row_logits, row_span, row_max, row_sum, v_token_scales
    )
    p_dtype = cfg.mma_dtype("pv")
    if fx.const_expr(cfg.narrow):
        if rescale:  # the lane holds the factors of its accumulators' columns, rows 2c and 2c + 1
            acc = [_rescaled(c, alphas) for c in acc]
        # token t's pair of rows (2c, 2c + 1) is row g (+ 8) of P^T: transposed, the lane holds tokens 2c, 2c + 1
        pairs = [nvvm.pack_f32x2(probs[0][t], probs[1][t], p_dtype) for t in range(2)]
        p_fragments = [vector.from_elements(W2, [nvvm.movmatrix_trans(pair) for pair in pairs])]
    else:
        if rescale:  # O^T's columns are rows 2c + {0, 1} (+ 8 for the second p tile): their factors from their lanes
            columns = [[nvvm.shfl_sync(alphas[t], (2 * lane_c + j) * 4) for j in range(2)] for t in range(cfg.p_tiles)]
            acc = [_rescaled(c, columns[i % cfg.p_tiles]) for i, c in enumerate(acc)]  # acc[tile * p_tiles + t]
        p_fragments = []
        for t in fx.range_constexpr(cfg.p_tiles):
            p = probs[t]
            p_fragments.append(
                vector.from_elements(W2, [nvvm.pack_f32x2(p[0], p[1], p_dtype), nvvm.pack_f32x2(p[2], p[3], p_dtype)])
            )
    new_acc = []
    for tile in fx.range_constexpr(cfg.head_dim // 16):
        a = _value_fragment(cfg, values, tile)
        for t in fx.range_constexpr(cfg.p_tiles):
            new_acc.append(nvvm.mma_sync(a, p_fragments[t], acc[tile * cfg.p_tiles + t], dtype=p_dtype))
    return [new_max, new_sum, new_acc]


def _logit(cfg, score, row, slot, token, consts, k_token_scales):
    """A score of the lane's row ``row`` as a base-2 logit: scaled (the row's factor, the token's key scale in
    ``slot``), capped, and -inf outside the row's visible tokens."""
    row_scale, cap, lows, highs, _, _ = consts
    x = score * row_scale[row]
    if fx.const_expr(cfg.k_scale == "token"):
        x = x * k_token_scales[slot]
    if fx.const_expr(cfg.soft_cap):
        x = cap * math.tanh(x / cap)
    visible = (token < highs[row]) & (token >= lows[row])
    return arith.select(visible, x * LOG2E, fx.Float32(float("-inf")))


def _online_softmax(cfg, row_logits, row_span, row_max, row_sum, v_scales=None):
    """The online softmax over the lane's rows (``row_logits``: per row, its logits in this lane; ``row_span``: the
    lane offsets whose XOR reaches a row's other lanes). Returns the new ``(max, sum)`` (two rows; one left as it was
    where only one is used), the rows' rescale factors, P per row, and whether the warp rescales (True: always, where
    ``cfg.rescale_slack`` is None). ``v_scales`` (values scaled per token: the scales of the lane's tokens, in the
    order of a row's logits): the maximum is taken over the logits plus log2 of their scales (rounded down) and P is
    returned times the scales, at most ``2^(slack + 1)`` and the largest near 1 (f16 for the P V MMAs, however small
    the scales); the sums, of P alone, stay float32, and the merge sees the same ``(max, sum)`` pairs."""
    v_logs = None if v_scales is None else [_log2_below(x) for x in v_scales]
    chunk_max = []
    for logits in row_logits:
        shifted = logits if v_logs is None else [x + v_logs[i] for i, x in enumerate(logits)]
        m = shifted[0]
        for x in shifted[1:]:
            m = arith.maximum(m, x)
        for offset in row_span:
            m = arith.maximum(m, nvvm.shfl_sync(m, offset, "bfly"))
        chunk_max.append(m)
    slack, rescale = cfg.rescale_slack, True
    if fx.const_expr(slack is not None):
        grows = chunk_max[0] > row_max[0] + slack
        for r in fx.range_constexpr(1, len(row_logits)):
            grows = grows | (chunk_max[r] > row_max[r] + slack)
        rescale = nvvm.vote_sync(grows, "any")
    new_max, new_sum, alphas, probs = list(row_max), list(row_sum), [], []
    for r in fx.range_constexpr(len(row_logits)):
        m = arith.maximum(chunk_max[r], row_max[r])
        if fx.const_expr(slack is not None):
            m = arith.select(rescale, m, row_max[r])
        alpha = nvvm.ex2_approx(row_max[r] - m, ftz=True)
        p = [nvvm.ex2_approx(x - m, ftz=True) for x in row_logits[r]]
        total = p[0]
        for x in p[1:]:
            total = total + x
        new_max[r], new_sum[r] = m, row_sum[r] * alpha + total
        alphas.append(alpha)
        probs.append(p if v_scales is None else [x * v_scales[i] for i, x in enumerate(p)])
    return new_max, new_sum, alphas, probs, rescale


def _log2_below(scale):
    """At most log2(|``scale``|) and within 0.09 of it, and at least -64: the magnitude's bits read as an integer,
    times 2^-23, less 127 (an exponent plus the mantissa's fraction). The floor keeps ``2^(logit - max)`` finite where
    a row's maximum comes from tokens of scale 0 (or past the end, which load 0): their ``P * scale`` is then 0, not
    ``inf * 0``; a scale below 2^-64 only makes its token's ``P * scale`` smaller."""
    magnitude = arith.bitcast(fx.Int32.mlir_type(), scale) & 0x7FFFFFFF
    return arith.maximum(magnitude.to(fx.Float32) * (2.0**-23) - 127.0, -64.0)


def _rescaled(c, factors):
    """An accumulator fragment of ``O^T`` with its two query columns scaled by ``factors``."""
    return vector.from_elements(ACC, [c[0] * factors[0], c[1] * factors[1], c[2] * factors[0], c[3] * factors[1]])


def _key_fragment(cfg, keys, half, step):
    """Key rows ``chunk + 8 half + g`` at k16 step ``step`` (2 registers: elements ``2c + {0, 1}`` and ``2c + 8 +
    {0, 1}`` of the permuted head dimension): a B fragment of ``K^T``, or half an A fragment of ``K``."""
    per_load = cfg.key_chunk // 4  # k16 steps per 16-byte load
    words = keys[half * (cfg.head_dim // (4 * cfg.key_chunk)) + step // per_load]
    w = step % per_load
    if fx.const_expr(cfg.kv == "e4m3"):
        low, high = nvvm.cvt_e4m3x4_to_f16x2(words[w])
        return vector.from_elements(W2, [low, high])
    return vector.from_elements(W2, [words[2 * w], words[2 * w + 1]])


def _value_fragment(cfg, values, tile):
    """A fragment (4 registers) of ``V^T`` for the 16 head-dim rows of ``tile``: rows g, g + 8 are this lane's values
    ``2 tile``, ``2 tile + 1``, columns its tokens ``(2c, 2c + 1)`` and ``(2c + 8, 2c + 9)``."""
    a, b, c, d = values
    if fx.const_expr(cfg.kv != "e4m3"):
        return vector.from_elements(
            W4,
            [
                nvvm.prmt(a[tile], b[tile], 0x5410),
                nvvm.prmt(a[tile], b[tile], 0x7632),
                nvvm.prmt(c[tile], d[tile], 0x5410),
                nvvm.prmt(c[tile], d[tile], 0x7632),
            ],
        )
    word, odd = tile // 2, tile % 2  # f16: the two tokens' bytes of values 2 tile, 2 tile + 1, widened
    regs = []
    for pair in ((a, b), (c, d)):
        paired = nvvm.prmt(pair[0][word], pair[1][word], 0x7362 if odd else 0x5140)
        regs += list(nvvm.cvt_e4m3x4_to_f16x2(paired))
    return vector.from_elements(W4, regs)

"""The native engine's fast decode loop: a preallocated (static) KV cache, a lean decode
step over the model's own layers, and on CUDA every step replayed from a captured CUDA
graph.

A decode step of a small model in plain transformers is bound by the CPU: about a
thousand kernel launches, a new attention mask and a growing cache per token. Here the
cache never moves, the mask is one comparison, and on CUDA a whole step (forward,
sampling, bookkeeping) is one graph replay, so the GPU never waits for Python. Inside
it, the work between the matmuls runs compiled, the query, key and value projections are
one matmul (and in small models the gate and up projections too), attention (with the
rotary embedding and the cache write) is a Triton kernel (``decode_attention``), with one
more that reads a prompt's columns once for its samples, and sampling two more (``draw``).

Rows that finish keep their slot until the batch is compacted: on CUDA when half the
rows are done (graphs are captured per batch-size bucket, and with SDPA per cache-length
bucket too), on the CPU at every step. The host reads the sampled tokens every few steps,
not after each one, and on CUDA one chunk late, so that the GPU decodes on while the host
checks them.

It drives decoder-only models of the Llama family and the language models of Qwen2-VL
and Qwen2.5-VL (``supports``); anything else takes the engine's plain transformers loop.
A VLM's prompt is prefilled with its images and multi-axis positions (M-RoPE) by the
model's own forward; every response token is text, whose position is the same on each
axis, so the decode step passes one position three times.
"""

from __future__ import annotations

import sys
import warnings
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from rlx import models
from rlx.engines import decode_attention, draw, remap

ARCHITECTURES = {"llama", "qwen2", "qwen3", "mistral", "qwen2_vl", "qwen2_5_vl"}
GATE_UP_BYTES = 1 << 30  # the most the decode step's stacked gate and up projections may copy


def supports(model: Any) -> bool:
    """Whether ``model`` (a transformers causal LM or Qwen-VL, maybe under LoRA) can decode
    here: a Llama-family decoder with full attention in every layer, its weights materialised."""
    config = getattr(model, "config", None)
    if getattr(config, "model_type", None) not in ARCHITECTURES:
        return False
    # DeepSpeed ZeRO-3 keeps only a shard of each parameter outside its own forward hooks
    return models.full_attention(config) and not models.zero3(model)


class StaticDecoder:
    """Decodes a batch whose prompts were prefilled by a transformers forward: ``run``
    takes that forward's cache and last logits and returns each row's sampled tokens and
    their log-probs, cut after EOS or a stop string by ``finished``."""

    def __init__(self, model: Any, device: torch.device, *, graphs: bool, check_every: int = 8,
                 banned: torch.Tensor | None = None):
        self.model = model
        self.banned = banned  # ids never sampled (a VLM's image tokens)
        self.decoder = model.get_decoder()
        self.head = model.get_output_embeddings()
        self.layers = list(self.decoder.layers)
        attn = self.layers[0].self_attn
        self.head_dim = attn.head_dim
        text = model.config.get_text_config()
        self.kv_heads = text.num_key_value_heads
        self.groups = text.num_attention_heads // self.kv_heads
        self.mrope = hasattr(self.decoder.rotary_emb, "mrope_section")
        self.scale = attn.scaling
        self.rope = sys.modules[type(attn).__module__].apply_rotary_pos_emb
        self.device = device
        self.graphs = graphs and device.type == "cuda"
        self.check_every = check_every if self.graphs else 1
        self.rows = self.length = 0
        self._graphs: dict[tuple, torch.cuda.CUDAGraph] = {}
        self._pool = None
        self._warmup = None
        self._draw_rows = None
        # one generator for every graph (a graph replays the generator it was captured with)
        self.generator = torch.Generator(device)
        # Under graphs, the work between the matmuls (norms, rotary embedding, activation,
        # residual adds) runs compiled: fewer, fused kernels per step.
        fuse = torch.compile if self.graphs else (lambda fn, **_: fn)
        self._qkv, self._mlp = fuse(_qkv), fuse(_mlp)
        self.triton_attention = self.graphs and decode_attention.supported(self.head_dim, self.groups, device)
        # On the CPU the cache keeps each key head as [head_dim, columns], the layout the
        # query-key matmul reads without a copy: 2-3 % of W0's rollout
        self.keys_transposed = device.type == "cpu"
        self._projections = None
        self._gate_ups = None
        # Under graphs, the cache and stacked projections at addresses that outlive their
        # memory where the driver allows (``remap``): ``sleep`` then keeps the graphs
        self.remappable = self.graphs and remap.supported(device)
        self._cache_memory = self._projection_memory = None

    # -- buffers ------------------------------------------------------------------------

    def _allocate(self, rows: int, length: int, dtype: torch.dtype) -> None:
        """The cache and step state, kept between calls while they are large enough (a
        captured graph holds their addresses)."""
        if rows <= self.rows and length <= self.length:
            if self._cache_memory is not None:
                self._cache_memory.map()  # after ``sleep``: zeroed memory at the graphs' addresses
            return
        self.rows, self.length = max(rows, self.rows), max(length, self.length)
        self._drop_graphs()
        self._cache_memory = _close(self._cache_memory)
        shape = (self.rows, self.kv_heads, self.length, self.head_dim)
        on = dict(device=self.device)
        key_shape = (*shape[:2], self.head_dim, self.length) if self.keys_transposed else shape
        layers = len(self.layers)
        self._cache_memory, cache = self._buffers([(key_shape, dtype)] * layers + [(shape, dtype)] * layers)
        self.keys, self.values = cache[:layers], cache[layers:]
        self.valid = torch.zeros(self.rows, self.length, dtype=torch.bool, **on)  # prompt padding is False
        self.columns = torch.arange(self.length, **on)
        self.slots = torch.arange(self.rows, **on)
        self.token = torch.zeros(self.rows, dtype=torch.long, **on)
        self.position = torch.zeros(self.rows, dtype=torch.long, **on)
        self.column = torch.zeros(self.rows, dtype=torch.long, **on)  # the cache column each slot writes next
        self.width = torch.zeros(self.rows, dtype=torch.long, **on)  # each slot's prompt columns
        self.members = None  # the samples whose prompt columns a slot reads (``prompt_members``)
        # the sampled tokens and log-probs of the last steps, a ring the host reads every check_every steps
        self.ring = 2 * self.check_every
        self.step = torch.zeros(1, dtype=torch.long, **on)  # the ring's column this step writes
        self.out_tokens = torch.zeros(self.rows, self.ring, dtype=torch.long, **on)
        self.out_logprobs = torch.zeros(self.rows, self.ring, dtype=torch.float32, **on)
        if self.graphs:  # two pinned host buffers each, one being filled while the other is read
            size = self.rows * self.check_every
            self._host_tokens = [torch.empty(size, dtype=torch.long, pin_memory=True) for _ in range(2)]
            self._host_logprobs = [torch.empty(size, dtype=torch.float32, pin_memory=True) for _ in range(2)]
            self._flip = 0

    def _refresh_projections(self) -> None:
        """Each layer's query, key and value weights (and biases) stacked into one matrix, so
        that a step projects with one matmul rather than three (on W1 the key and value
        projections are tiny, latency-bound GEMMs). Copied afresh each run, since the policy
        trains its weights in between, into the same buffers, which a captured graph reads.
        Layers whose projections are not plain linear layers (LoRA-wrapped) keep theirs."""
        if self._projections is None:
            self._stack_buffers()
        elif self._projection_memory is not None:
            self._projection_memory.map(zero=False)  # after ``sleep``: filled below
        for layer, stacked in zip(self.layers, self._projections):
            if stacked is not None:
                attn = layer.self_attn
                weight, bias = stacked
                with torch.no_grad():
                    torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight], out=weight)
                    if bias is not None:
                        torch.cat([_bias(attn.q_proj), _bias(attn.k_proj), _bias(attn.v_proj)], out=bias)
        for layer, gate_up in zip(self.layers, self._gate_ups):
            if gate_up is not None:
                with torch.no_grad():
                    torch.cat([layer.mlp.gate_proj.weight, layer.mlp.up_proj.weight], out=gate_up)

    def _stack_buffers(self) -> None:
        """Empty buffers for each layer's stacked projections (``_stacked_shapes``), and under
        graphs its stacked gate and up projections (``_gate_up_shapes``)."""
        stacked = [_stacked_shapes(layer.self_attn) for layer in self.layers]
        gate_ups = _gate_up_shapes(self.layers) if self.graphs else [None] * len(self.layers)
        specs = [(shape, layer.self_attn.q_proj.weight.dtype)
                 for layer, pair in zip(self.layers, stacked) if pair for shape in pair if shape]
        specs += [(shape, layer.mlp.gate_proj.weight.dtype) for layer, shape in zip(self.layers, gate_ups) if shape]
        self._projection_memory, buffers = self._buffers(specs, zeroed=False)
        buffers = iter(buffers)
        self._projections = [None if pair is None else tuple(shape and next(buffers) for shape in pair)
                             for pair in stacked]
        self._gate_ups = [shape and next(buffers) for shape in gate_ups]

    def _buffers(self, specs, zeroed: bool = True) -> tuple[remap.Remappable | None, list[torch.Tensor]]:
        """Tensors of ``specs`` (shape, dtype): at remappable addresses when the decoder's are
        (with the memory that holds them), else from PyTorch's allocator."""
        if self.remappable and specs:
            try:
                memory = remap.Remappable(self.device, specs)
                return memory, memory.tensors
            except RuntimeError as error:  # a driver that refuses: graphs captured each rollout
                warnings.warn(f"the decode cache's addresses cannot be kept through rollout.sleep ({error})")
                self.remappable = False
        make = torch.zeros if zeroed else torch.empty
        return None, [make(shape, dtype=dtype, device=self.device) for shape, dtype in specs]

    def sleep(self) -> None:
        """Hand the cache and the stacked projections back while the policy trains. Where
        they are remappable the graphs stay, to replay over new memory at the same addresses;
        else everything goes, as in ``release``."""
        if self._cache_memory is None:
            self.release()
            return
        self._cache_memory.unmap()
        if self._projection_memory is not None:
            self._projection_memory.unmap()

    def _drop_graphs(self) -> None:
        """Forget the captured graphs and their memory pool. A pool outlives its graphs only
        with their memory: once they were all gone, a capture into it failed an assertion in
        torch's caching allocator (``use_count > 0``, on an H100). An evaluation's greedy
        rollout (one sample a prompt) between training rollouts drops the graphs so."""
        self._graphs.clear()
        self._pool = None

    def release(self) -> None:
        """Drop the cache, step state, stacked projections and graphs; the next ``run``
        allocates and captures again."""
        self.rows = self.length = 0
        self._drop_graphs()
        self._projections = self._gate_ups = None
        for name in ("keys", "values", "valid", "columns", "slots", "token", "position", "column", "width", "members",
                     "step", "out_tokens", "out_logprobs", "_host_tokens", "_host_logprobs", "_cos", "_sin"):
            self.__dict__.pop(name, None)
        self._cache_memory, self._projection_memory = _close(self._cache_memory), _close(self._projection_memory)

    # -- one decode step ----------------------------------------------------------------

    def _forward(self, b: int, span: int, params, generator) -> None:
        """Embed the last token of rows ``[:b]``, attend over cache columns ``[:span]``,
        sample the next token and record it: every write in place, so a graph can replay it."""
        x = self._layers_graphed(b, span) if self.graphs else self._layers_eager(b, span)
        logits = self.head(x)
        token, logprob = sample(logits, params, generator, self.banned, self._draw_rows)
        self.out_tokens[:b].index_copy_(1, self.step, token[:, None])
        self.out_logprobs[:b].index_copy_(1, self.step, logprob[:, None])
        self.token[:b].copy_(token)
        # a row that has ended but not yet left the batch writes on in its last column, at
        # the last position the cache has (the CPU's rotary table holds no more)
        self.position[:b].add_(1).clamp_(max=self.length - 1)
        self.column[:b].add_(1).clamp_(max=self.length - 1)
        self.step.add_(1).remainder_(self.ring)

    def _layers_graphed(self, b: int, span: int) -> torch.Tensor:
        """The decoder layers' output for rows ``[:b]`` [b, hidden], as a CUDA graph captures them."""
        x = self.decoder.embed_tokens(self.token[:b, None])
        position = self.position[:b, None]
        if self.mrope:  # [axes, b, 1]: a text token sits at the same position on every axis
            position = position.expand(3, -1, -1)
        cos, sin = self.decoder.rotary_emb(x, position)  # [b, 1, head_dim]
        mask = rotary = None
        if self.triton_attention:  # the kernel turns the heads and reads the valid columns itself
            rotary = cos.view(b, self.head_dim), sin.view(b, self.head_dim)
        else:
            mask = (self.valid[:b, :span] & (self.columns[:span] <= self.column[:b, None]))[:, None, None, :]
        rope = None if rotary else self.rope
        # each layer's MLP output joins the residual stream in the next layer's first kernel,
        # with its norm: one kernel fewer a layer
        mlp = None
        for i, (layer, stacked, gate_up) in enumerate(zip(self.layers, self._projections, self._gate_ups)):
            x, q, k, v = self._qkv(layer, x, mlp, cos, sin, rope, stacked)
            x, mlp = self._mlp(layer, x, self._attention(i, q, k, v, mask, b, span, rotary), gate_up)
        return self.decoder.norm((x + mlp)[:, 0])

    def _layers_eager(self, b: int, span: int) -> torch.Tensor:
        """``_layers_graphed`` on the CPU, where every op is a dispatch of its own: the rotary
        embedding is read from a table made once a run (``_rotary_table``) and turns the
        query and key heads together, each half in place (a swapped copy of the heads cost
        4 % of W0's rollout), the norms run without their module calls, attention is two
        matmuls with one additive mask for every layer."""
        x = self.decoder.embed_tokens(self.token[:b])
        position = self.position[:b]
        cos, sin = self._cos[position], self._sin[position]  # [b, 1, head_dim]
        half = self.head_dim // 2
        sin_first, sin_second = sin[..., :half], sin[..., half:]
        # -inf on the columns a row does not see
        mask = (self.valid[:b, :span] & (self.columns[:span] <= self.column[:b, None]))[:, None, None, :]
        mask = torch.where(mask, 0.0, float("-inf")).to(x.dtype)
        for i, (layer, stacked) in enumerate(zip(self.layers, self._projections)):
            qk, v = _qk_v(layer, x, stacked, self.kv_heads)
            # x·cos, then each half plus the other half times its sin: no swapped copy
            turned = qk * cos
            turned[..., :half].addcmul_(qk[..., half:], sin_first)
            turned[..., half:].addcmul_(qk[..., :half], sin_second)
            qk = turned
            q, k = qk[:, :-self.kv_heads], qk[:, -self.kv_heads:]
            attended = self._attention(i, q, k[:, :, None], v[:, :, None], mask, b, span).view(b, -1)
            x = x + layer.self_attn.o_proj(attended)
            x = x + layer.mlp(_rms(x, layer.post_attention_layernorm))
        return _rms(x, self.decoder.norm)

    def _rotary_table(self) -> None:
        """cos and sign-folded sin of every cache column's position [length, 1, head_dim], from
        the model's own rotary embedding: row p turns a head at position p as
        x·cos + swap_halves(x)·sin, which is x·cos + rotate_half(x)·sin."""
        dummy = self.head.weight[:1]  # the dtype and device the embedding computes for
        position = torch.arange(self.length, device=self.device)[None]
        if self.mrope:  # a text token sits at the same position on every axis: any axis's values
            position = position.expand(3, -1, -1)
        cos, sin = self.decoder.rotary_emb(dummy, position)
        if cos.dim() == 4:
            cos, sin = cos[0], sin[0]
        half = self.head_dim // 2
        sign = torch.cat([-torch.ones(half), torch.ones(half)]).to(sin)
        self._cos, self._sin = cos[0][:, None], (sin[0] * sign)[:, None]

    def _attention(self, i, q, k, v, mask, b: int, span: int, rotary=None) -> torch.Tensor:
        """Write this step's key and value into the cache and attend over ``span`` columns;
        ``mask`` [b, 1, 1, span] is the columns each row sees (boolean), or additive. The
        Triton kernel takes the query and key unturned, and ``rotary`` (cos, sin)."""
        # The query heads that share a KV head stand in for the query length: one pass
        # reads each cached key and value once, with no copies for grouped-query attention.
        q = q.reshape(b, self.kv_heads, self.groups, self.head_dim)
        if self.triton_attention:  # the kernel writes the key and value too
            out = decode_attention.decode_attention(q, k, v, *rotary, self.keys[i], self.values[i], self.valid,
                                                    self.column, span, self.scale, self.width, self.members)
            return out.reshape(b, 1, -1)
        self.values[i][self.slots[:b], :, self.column[:b]] = v[:, :, 0]
        values = self.values[i][:b, :, :span]
        if self.keys_transposed:  # two matmuls: SDPA's CPU kernel is slower on one query per row
            self.keys[i][self.slots[:b], :, :, self.column[:b]] = k[:, :, 0]
            scores = torch.matmul(q * self.scale, self.keys[i][:b, ..., :span]).add_(mask)
            return torch.matmul(scores.softmax(-1), values).reshape(b, 1, -1)
        self.keys[i][self.slots[:b], :, self.column[:b]] = k[:, :, 0]
        keys = self.keys[i][:b, :, :span]
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=self.scale)
        return out.reshape(b, 1, -1)

    def _replay(self, b: int, span: int, params, generator) -> None:
        """One step for rows ``[:b]``: eager on the CPU, a graph replay on CUDA."""
        if not self.graphs:
            return self._forward(b, span, params, generator)
        key = (b, span, params.temperature, params.top_k, params.top_p, params.greedy or params.temperature == 0)
        graph = self._graphs.get(key)
        if graph is None:
            graph = self._graphs[key] = self._capture(b, span, params, generator)
        graph.replay()

    def _capture(self, b: int, span: int, params, generator) -> torch.cuda.CUDAGraph:
        state = [t.clone() for t in (self.token, self.position, self.column, self.step)]
        # one warm-up stream for every capture: each new stream would get a cuBLAS workspace
        # of its own that lives as long as the process (with rollout.sleep, some every rollout)
        if self._warmup is None:
            self._warmup = torch.cuda.Stream(self.device)
        stream = self._warmup
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):  # warm-up (kernel choice, workspaces) off the graph
            self._forward(b, span, params, torch.Generator(self.device).manual_seed(0))
        torch.cuda.current_stream().wait_stream(stream)
        for t, saved in zip((self.token, self.position, self.column, self.step), state):
            t.copy_(saved)
        graph = torch.cuda.CUDAGraph()
        graph.register_generator_state(generator)
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        # Captured on the warm-up stream without torch.cuda.graph's housekeeping, which waits
        # for the device and empties its cache and the pinned host memory's, for the rollout
        # and the update to allocate again. thread_local: with overlapped rollouts the update
        # runs (and syncs) in another thread while this one captures, which the default
        # global mode would forbid.
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            graph.capture_begin(pool=self._pool, capture_error_mode="thread_local")
            try:
                self._forward(b, span, params, generator)
            finally:
                graph.capture_end()
        torch.cuda.current_stream().wait_stream(stream)
        return graph

    # -- a batch ------------------------------------------------------------------------

    def run(self, prefill, prompts: int, width: int, n: int, capacity: int, params, seed: int,
            finished) -> tuple[list[list[int]], list[list[float]]]:
        """Decode ``n`` samples of each of ``prompts`` prompts, at most ``capacity`` rows at
        a time; returns each row's tokens and log-probs (row r is a sample of prompt r // n).

        ``prefill(first, count)`` runs prompts ``[first, first + count)`` through the model
        and returns their cache (keys and values left-padded to the attention mask's width),
        last logits, attention mask and the position of each one's next token; ``width`` is
        the longest prompt. ``finished`` (``rlx.rollout.Ends``) says whether a completion
        is over: its ``eos`` ids are checked for all rows at once, stop strings row by row.

        Prompts join as rows finish: once a quarter of the slots are free and prompts are
        waiting, the rows still decoding move to the front and the next prompts are
        prefilled into the slots behind them, so a few long completions do not keep a batch
        of finished ones waiting. Each slot writes its own cache column.
        """
        generator = self.generator.manual_seed(seed)
        rows, max_new = prompts * n, params.max_new_tokens
        capacity = min(capacity, rows)
        self._allocate(capacity, width + max_new, self.head.weight.dtype)
        self._refresh_projections()
        if not self.graphs:
            self._rotary_table()
        self.step.zero_()
        # each row's tokens and log-probs so far, filled a step at a time for all rows at once
        tokens = np.zeros((rows, max_new), np.int64)
        logprobs = np.zeros((rows, max_new), np.float32)
        length = np.zeros(rows, np.int64)
        done = np.zeros(rows, bool)
        eos = np.fromiter(finished.eos, np.int64)
        slots = np.zeros(0, np.int64)  # slot s decodes row slots[s]
        # a row's cache column at decode step t is offset[row] + t
        offset = np.zeros(rows, np.int64)
        admitted = decoded = read = 0  # prompts prefilled; decode steps run; steps read back

        def admit(count: int) -> None:
            """Prefill the next ``count`` prompts into the slots after the last one in use."""
            nonlocal admitted, slots
            cache, logits, attention, positions = prefill(admitted, count)
            columns, place = attention.shape[1], slice(len(slots), len(slots) + count * n)
            for i, layer in enumerate(cache.layers):
                if self.keys_transposed:
                    self.keys[i][place, :, :, :columns] = layer.keys.transpose(-1, -2).repeat_interleave(n, 0)
                else:
                    self.keys[i][place, :, :columns] = layer.keys.repeat_interleave(n, 0)
                self.values[i][place, :, :columns] = layer.values.repeat_interleave(n, 0)
            self.valid[place, :columns] = attention.repeat_interleave(n, 0).bool()
            self.valid[place, columns:] = True  # decoded columns: masked by the slot's column until written
            self.position[place] = positions.repeat_interleave(n, 0)
            self.column[place] = columns
            self.width[place] = columns
            new = range(admitted * n, (admitted + count) * n)
            # the first token comes from the prefill's logits
            token, logprob = sample(logits.repeat_interleave(n, 0), params, generator, self.banned,
                                    _draw_rows(list(new), rows))
            self.token[place] = token
            take(np.arange(new.start, new.stop), token.numpy(force=True), logprob.numpy(force=True))
            offset[new.start:new.stop] = columns - decoded
            slots = np.concatenate([slots, np.arange(new.start, new.stop)])
            admitted += count

        def take(chunk_rows, new_tokens, new_logprobs):
            """Append one token (and its log-prob) to each of ``chunk_rows`` still going."""
            going = ~done[chunk_rows]
            live, new_tokens, new_logprobs = chunk_rows[going], new_tokens[going], new_logprobs[going]
            tokens[live, length[live]] = new_tokens
            logprobs[live, length[live]] = new_logprobs
            length[live] += 1
            ended = np.isin(new_tokens, eos) | (length[live] == max_new)
            if finished.stop:  # stop strings are found in decoded text, a row at a time
                for i in np.flatnonzero(~ended):
                    ended[i] = finished.hits_stop(tokens[live[i], :length[live[i]]].tolist())
            done[live] = ended

        def absorb(chunk, chunk_rows):
            new_tokens, new_logprobs = chunk()
            for step in range(new_tokens.shape[1]):
                take(chunk_rows, new_tokens[:, step], new_logprobs[:, step])

        admit(min(prompts, capacity // n))
        b = self._bucket(len(slots), capacity)
        # the furthest a slot's row has got: its cache column at decode step t is that + t
        furthest = int(offset[slots].max())
        self._share_prompts(slots, n)
        self._draw_rows = _draw_rows(slots.tolist(), rows)  # each slot's row, for the CPU's draws once slots move
        # Under graphs a chunk copied out is read one chunk later: the host checks it while
        # the GPU decodes the next steps, instead of the GPU waiting for the host.
        pending = None
        while True:
            if decoded % self.check_every == 0:
                if decoded > read:
                    chunk = (self._copy_out(len(slots), read, decoded), slots)
                    read = decoded
                    if pending is not None:
                        absorb(*pending)
                    pending = chunk
                    if not self.graphs or done[slots].all():
                        absorb(*pending)
                        pending = None
                alive = np.flatnonzero(~done[slots])
                waiting = prompts - admitted
                if len(alive) == 0 and not waiting:
                    break
                # finished rows stay in the batch until half of it is done, or a quarter of
                # it can take new prompts: moving the cache every time a row ended took a
                # fifth of a tiny model's CPU rollout
                free = capacity - len(alive)
                refill = waiting and free >= max(n, capacity // 4)
                if refill or len(alive) <= b // 2:
                    self._compact(alive, b)
                    slots = slots[alive]
                    if refill:
                        admit(min(waiting, free // n))
                    b = self._bucket(len(slots), capacity if refill else b)
                    self._share_prompts(slots, n)
                    self._draw_rows = _draw_rows(slots.tolist(), rows)
                    furthest = int(offset[slots].max(initial=0))
            self._replay(b, self._span(min(self.length, furthest + decoded + 1)), params, generator)
            decoded += 1
        return ([tokens[row, :length[row]].tolist() for row in range(rows)],
                [logprobs[row, :length[row]].tolist() for row in range(rows)])

    def _copy_out(self, n: int, start: int, end: int):
        """Start copying the outputs of decode steps ``[start:end]`` (at most ``check_every``
        of them, from a multiple of it: one stretch of the ring) of slots ``[:n]`` to the
        host; returns a call that waits for the copy and gives them as numpy arrays."""
        first = start % self.ring
        columns = slice(first, first + end - start)
        if not self.graphs:
            return lambda: (self.out_tokens[:n, columns].numpy(force=True), self.out_logprobs[:n, columns].numpy(force=True))
        self._flip ^= 1
        size = n * (end - start)
        host_tokens = self._host_tokens[self._flip][:size].view(n, end - start)
        host_logprobs = self._host_logprobs[self._flip][:size].view(n, end - start)
        host_tokens.copy_(self.out_tokens[:n, columns], non_blocking=True)
        host_logprobs.copy_(self.out_logprobs[:n, columns], non_blocking=True)
        copied = torch.cuda.Event()
        copied.record()
        return lambda: (copied.synchronize(), host_tokens.numpy(), host_logprobs.numpy())[1:]

    def _span(self, columns: int) -> int:
        """Cache columns a step attends over: exact on the CPU; under graphs (one graph per
        span), in steps of 128 for SDPA, and the whole cache for the Triton kernel, which
        reads each row only up to its own column: one graph for a batch size rather than one
        per 128 columns, each capture of which (again after every ``rollout.sleep``) took
        tens of milliseconds."""
        if not self.graphs:
            return columns
        if self.triton_attention:
            return self.length
        return min(self.length, -(-columns // 128) * 128)

    def _bucket(self, alive: int, most: int) -> int:
        """The batch size that decodes ``alive`` rows, at most ``most``: exact on the CPU, the
        smallest power of two that holds them under graphs."""
        if not self.graphs:
            return alive
        return min(most, 1 << max(alive - 1, 0).bit_length())

    def _share_prompts(self, slots: np.ndarray, n: int) -> None:
        """Group the slots decoding samples of one prompt (row r is a sample of prompt
        r // n) for the attention kernel, which then reads a prompt's columns once for all
        of them. With one sample a prompt, or without the kernel, each slot reads its own."""
        per_tile = min(n, decode_attention.samples_per_tile(self.groups, self.head_dim))
        if not self.triton_attention or per_tile == 1:
            if self.members is not None:
                self.members = None
                self._drop_graphs()  # they read the groups
            return
        if self.members is None or self.members.shape[1] != per_tile:
            self.members = torch.empty(self.rows, per_tile, dtype=torch.long, device=self.device)
            self._drop_graphs()
        self.members.copy_(torch.from_numpy(prompt_members(slots, n, per_tile, self.rows)))

    def _compact(self, alive: np.ndarray, b: int) -> None:
        """Move the slots still decoding to the front, in order (their outputs so far have
        been copied out)."""
        index = torch.tensor(alive, dtype=torch.long, device=self.device)
        n = len(alive)
        for buffers in (self.keys, self.values):
            for t in buffers:
                t[:n] = t[:b].index_select(0, index)
        for t in (self.valid, self.token, self.position, self.column, self.width):
            t[:n] = t[:b].index_select(0, index)


def prompt_members(slots: np.ndarray, n: int, per_tile: int, rows: int) -> np.ndarray:
    """[rows, per_tile] the slots each slot reads the prompt columns for (-1 for none): the
    first slot of a prompt's samples (slot s decodes row ``slots[s]``, a sample of prompt
    ``slots[s] // n``) leads them, ``per_tile`` at most, the next ones the next leader. A
    batch bucket's spare slots lead themselves, so every slot the kernel attends for has
    its prompt read."""
    members = np.full((rows, per_tile), -1, np.int64)
    spare = np.arange(len(slots), rows)
    members[spare, 0] = spare
    samples: dict[int, list[int]] = {}
    for s, row in enumerate(slots.tolist()):
        samples.setdefault(row // n, []).append(s)
    for group in samples.values():
        for i in range(0, len(group), per_tile):
            tile = group[i:i + per_tile]
            members[tile[0], :len(tile)] = tile
    return members


def _draw_rows(slots: list[int], rows: int) -> tuple[torch.Tensor, int] | None:
    """``sample``'s ``rows`` for slots decoding rows ``slots`` of ``rows``: None while they
    are all the rows in order."""
    return None if slots == list(range(rows)) else (torch.tensor(slots), rows)


def _close(memory: remap.Remappable | None) -> None:
    if memory is not None:
        memory.close()


def _stacked_shapes(attn) -> tuple[tuple[int, int], tuple[int] | None] | None:
    """The shapes of ``attn``'s stacked query, key and value projection (weight, bias), or
    None when one of them is not a plain linear layer."""
    projections = (attn.q_proj, attn.k_proj, attn.v_proj)
    if any(type(p) is not torch.nn.Linear for p in projections):
        return None
    rows = sum(p.out_features for p in projections)
    bias = (rows,) if any(p.bias is not None for p in projections) else None
    return (rows, projections[0].in_features), bias


def _bias(linear) -> torch.Tensor:
    return linear.bias if linear.bias is not None else linear.weight.new_zeros(linear.out_features)


def _qkv(layer, x, mlp, cos, sin, rope, stacked=None):
    """The layer's input (``x``, plus the last layer's ``mlp`` output unless None) and its
    normed projection to this step's query, key and value heads [b, heads, 1, d], the
    query and key turned by ``rope`` unless None."""
    attn = layer.self_attn
    if mlp is not None:
        x = x + mlp
    h = layer.input_layernorm(x)
    shape = (x.shape[0], 1, -1, attn.head_dim)
    if stacked is None:
        q, k, v = attn.q_proj(h), attn.k_proj(h), attn.v_proj(h)
    else:
        q, k, v = F.linear(h, *stacked).split([attn.q_proj.out_features, attn.k_proj.out_features,
                                               attn.v_proj.out_features], -1)
    q, k = q.view(shape), k.view(shape)
    if hasattr(attn, "q_norm"):  # Qwen3 normalises each head's query and key
        q, k = attn.q_norm(q), attn.k_norm(k)
    q, k = q.transpose(1, 2), k.transpose(1, 2)
    if rope is not None:
        q, k = rope(q, k, cos, sin)
    return x, q, k, v.view(shape).transpose(1, 2)


def _qk_v(layer, x, stacked, kv_heads: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows ``x`` [b, hidden] normed and projected to their query and key heads, one tensor
    [b, heads + kv_heads, head_dim], and value heads [b, kv_heads, head_dim]."""
    attn = layer.self_attn
    h = _rms(x, layer.input_layernorm)
    shape = (x.shape[0], -1, attn.head_dim)
    if stacked is None:
        q, k, v = attn.q_proj(h).view(shape), attn.k_proj(h).view(shape), attn.v_proj(h).view(shape)
        qk = torch.cat([q, k], 1)
    else:
        qkv = F.linear(h, *stacked).view(shape)
        qk, v = qkv[:, :-kv_heads], qkv[:, -kv_heads:]
    if hasattr(attn, "q_norm"):  # Qwen3 normalises each head's query and key
        qk = torch.cat([_rms(qk[:, :-kv_heads], attn.q_norm), _rms(qk[:, -kv_heads:], attn.k_norm)], 1)
    return qk, v


def _rms(x: torch.Tensor, norm) -> torch.Tensor:
    """``norm(x)`` for the RMS norms of the supported models, computed as they compute it,
    without the module call (a norm of another kind is called)."""
    if not hasattr(norm, "variance_epsilon"):
        return norm(x)
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon)
    return norm.weight * h.to(x.dtype)


def _gate_up_shapes(layers) -> list[tuple[int, int] | None]:
    """The shape of each layer's gate and up projections stacked into one matrix, where every
    layer's are plain linear layers without bias and the copies take at most
    ``GATE_UP_BYTES``; else None for every layer. One matmul for the two: on W1 (hidden 896)
    that took 16 µs of the two's 20 at 512 rows; from hidden 1536 on the two run as fast as one."""
    mlps = [layer.mlp for layer in layers]
    plain = all(type(getattr(m, name, None)) is torch.nn.Linear and getattr(m, name).bias is None
                for m in mlps for name in ("gate_proj", "up_proj", "down_proj"))
    if not plain or sum(2 * m.gate_proj.weight.nbytes for m in mlps) > GATE_UP_BYTES:
        return [None] * len(layers)
    return [(2 * m.gate_proj.out_features, m.gate_proj.in_features) for m in mlps]


def _mlp(layer, x, attended, gate_up=None):
    """The rest of the layer after attention: the output projection and its residual, and
    the MLP's output (its gate and up projections one matmul with ``gate_up``), which the
    caller adds to the residual stream."""
    x = x + layer.self_attn.o_proj(attended)
    h = layer.post_attention_layernorm(x)
    if gate_up is None:
        return x, layer.mlp(h)
    gate, up = F.linear(h, gate_up).chunk(2, -1)
    return x, layer.mlp.down_proj(layer.mlp.act_fn(gate) * up)


def sample(logits: torch.Tensor, params, generator: torch.Generator | None, banned: torch.Tensor | None = None,
           rows: tuple[torch.Tensor, int] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Next token of each row and its log-prob under softmax(logits / T), before top-k/top-p.

    A draw is one uniform per row through the cumulative distribution: the exponential
    race's uniform per row and token took about a tenth of a tiny model's CPU rollout. On
    CUDA, where nothing may sync with the host inside a graph, an unrestricted draw is two
    Triton kernels (``rlx.engines.draw``), and a top-k/top-p one the exponential race
    (arg-max of p_i / E_i with E_i ~ Exp(1), which picks i with probability p_i). ``rows``
    (these rows' places among all the batch's rows, and how many there are) gives a row the
    same uniform on the CPU whichever rows are still decoding. Like top-k, ``banned`` ids
    shape the draw (they are never drawn), not the reported log-prob.
    """
    temperature = params.temperature if params.temperature > 0 else 1.0
    greedy = params.greedy or params.temperature == 0
    truncated = params.top_k > 0 or params.top_p < 1.0
    if not (greedy or truncated) and draw.supported(logits.device):
        return draw.draw(logits, temperature, generator, banned)
    scaled = logits.float() if temperature == 1 else logits.float() / temperature
    if not (greedy or truncated) and logits.device.type != "cuda":
        # one softmax serves the draw and the log-prob: a pass fewer than log-softmax and exp
        probs = scaled.softmax(-1)
        weights = probs if banned is None else probs.index_fill(-1, banned, 0.0)
        token = _inverse_cdf(weights, _uniforms(len(logits), rows, generator))
        return token, probs.gather(-1, token[:, None]).squeeze(-1).log()
    logprobs = scaled.log_softmax(-1)
    drawn = logprobs if banned is None else logprobs.index_fill(-1, banned, float("-inf"))
    if greedy:
        token = drawn.argmax(-1)
    else:
        if truncated:  # on the distribution without the banned ids
            drawn = truncate(drawn if banned is None else drawn.log_softmax(-1), params.top_k, params.top_p)
        if logits.device.type == "cuda":
            token = (drawn.exp() / torch.empty_like(drawn).exponential_(generator=generator)).argmax(-1)
        else:
            token = _inverse_cdf(drawn.exp(), _uniforms(len(logits), rows, generator))
    return token, logprobs.gather(-1, token[:, None]).squeeze(-1)


def _uniforms(n: int, rows: tuple[torch.Tensor, int] | None, generator: torch.Generator | None) -> torch.Tensor:
    """A uniform in (0, 1] for each of ``n`` rows: drawn for all the batch's rows, then
    picked by place, so that a row's draw does not depend on which rows remain."""
    if rows is None:
        return 1 - torch.rand(n, generator=generator)
    index, total = rows
    return (1 - torch.rand(total, generator=generator))[index]


def _inverse_cdf(weights: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """The first token whose cumulative weight reaches ``uniform`` × the total: token i with
    probability weight_i / total (a zero weight is never picked, as ``uniform`` > 0)."""
    cumulative = weights.cumsum(-1)
    target = uniform.to(cumulative.dtype) * cumulative[:, -1]
    return torch.searchsorted(cumulative, target[:, None]).squeeze(-1).clamp_(max=weights.shape[-1] - 1)


def truncate(logprobs: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Top-k, then top-p (nucleus) on the renormalised top-k distribution; dropped tokens get −inf."""
    if 0 < top_k < logprobs.shape[-1]:
        kth = logprobs.topk(top_k, dim=-1).values[:, -1:]
        logprobs = logprobs.masked_fill(logprobs < kth, float("-inf")).log_softmax(-1)
    if top_p < 1.0:
        sorted_logprobs, order = logprobs.sort(-1, descending=True)
        probs = sorted_logprobs.exp()
        # Drop a token once the tokens ranked above it hold more than top_p of the mass.
        drop_sorted = probs.cumsum(-1) - probs > top_p
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        logprobs = logprobs.masked_fill(drop, float("-inf"))
    return logprobs

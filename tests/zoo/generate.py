"""Writes the model zoo that tests/py/zoo.py trains: twelve PyTorch models with tiny configs (plus the Llama
with SDPA at opset 23, a model of torch's indexing ops, an embedding with a padding_idx, which
export_torch.py records in the file's metadata, an LSTM + GRU and a ConvTranspose decoder), each exported both
ways, and PyTorch's reference trajectory.

usage: python3 tests/zoo/generate.py [NAME ...]     (torch 2.15, torchvision, transformers 5, onnx, onnxscript)
       python3 tests/zoo/generate.py --bf16 [NAME ...]   the decoders' autocast bf16 trajectory, into ref.json

Per model NAME, tests/zoo/NAME/ gets
  dynamo.onnx        torch.onnx.export(..., dynamo=True, optimize=False) through scripts/export_torch.py
                     (at the exporter's default opset; llama_sdpa23 at opset 23)
  torchscript.onnx   torch.onnx.export(..., dynamo=False, training=TRAINING, do_constant_folding=False)
  INPUT.npy ...      the one global batch (4 samples) every step trains on, labels.npy its class labels
  ref.json           the recipe and PyTorch's trajectory: 3 AdamW steps at world 2; the package versions
                     ("versions"); per export, what its metadata records for --export-safetensors: the
                     non-persistent buffers ("non_persistent") and tied parameters' other names ("tied")
Hugging Face models are built as they are (a ModelOutput): export_torch.wrap_outputs makes their forward return
.logits, their inputs by keyword, as scripts/export_torch.py does for a user.
Both exports keep the parameters as external data (FILE.onnx.params, not committed): every parameter's initial
value is drawn by zoo.param_values (NumPy, from the model's seed and the parameter's index, mean and std), so
tests/py/zoo.py writes the data file again with Debian's NumPy and the committed files stay small (ResNet-18 in
float64 is 90 MB of weights).  Buffers and constants stay inline.

The reference: PyTorch eager, the exported batch being one rank's (2 samples), world 2 simulated as in
tests/py/torch_ref.py: each rank's half through its own forward call (per-rank BatchNorm statistics), backward
of loss / 2, one AdamW step (lr 1e-3, betas 0.9/0.999, eps 1e-8, weight decay 0.01); the loss is
cross_entropy(logits, labels) over the last axis, as fsdpc's --loss cross_entropy:logits,labels.  ref.json keeps
the 3 losses and, per parameter, its final values at up to 48 fixed positions, its max |w| and its L2 norm.
Models with training-mode BatchNorm (resnet18, mobilenet_v3_small) run in float64, the rest in float32.
"""
import json
import os
import sys

import numpy as np
import torch
import torch.nn as nn

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
sys.path.insert(0, os.path.join(ROOT, "tests", "py"))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
sys.path.insert(0, os.path.join(ROOT, "examples"))

import export_torch  # noqa: E402
from zoo import ADAMW, GLOBAL_B, STEPS, WORLD, param_values  # noqa: E402

VOCAB, T, CLASSES = 100, 16, 10


def tokens(rng, *shape):
    return rng.integers(0, VOCAB, shape).astype(np.int64)


def images(rng, size, dtype):
    return rng.standard_normal((GLOBAL_B, 3, size, size)).astype(dtype)


def mlp(rng):
    m = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, CLASSES))
    return m, {"x": rng.standard_normal((GLOBAL_B, 16)).astype(np.float32)}, rng.integers(0, CLASSES, GLOBAL_B)


def nanogpt(rng):
    from gpt import GPT, GPTConfig
    m = GPT(GPTConfig(vocab_size=VOCAB, n_layer=2, n_head=2, n_embd=32, block_size=T, dropout=0.0, tied=True))
    return m, {"input_ids": tokens(rng, GLOBAL_B, T)}, tokens(rng, GLOBAL_B, T)


def gpt2(rng):
    from transformers import GPT2Config, GPT2LMHeadModel
    cfg = GPT2Config(vocab_size=VOCAB, n_positions=32, n_embd=32, n_layer=2, n_head=2, resid_pdrop=0.0,
                     embd_pdrop=0.0, attn_pdrop=0.0, attn_implementation="eager")
    return GPT2LMHeadModel(cfg), {"input_ids": tokens(rng, GLOBAL_B, T)}, tokens(rng, GLOBAL_B, T)


def llama(rng):
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32,
                      attn_implementation="eager")
    return LlamaForCausalLM(cfg), {"input_ids": tokens(rng, GLOBAL_B, T)}, tokens(rng, GLOBAL_B, T)


def llama_sdpa23(rng):
    """the Llama above with torch's scaled_dot_product_attention, its dynamo export at opset 23: Attention
    (grouped KV heads, HF's float causal mask) and RMSNormalization"""
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32,
                      attn_implementation="sdpa")
    return LlamaForCausalLM(cfg), {"input_ids": tokens(rng, GLOBAL_B, T)}, tokens(rng, GLOBAL_B, T)


def llama_sdpa(rng):
    """the Llama above as Hugging Face builds it by default (attn_implementation "sdpa": torch's
    scaled_dot_product_attention with enable_gqa), at the exporter's default opset: torch's decomposition of the
    SDPA (q and k^T each scaled by the scale's square root, k^T through 3-D views, a per-batch causal mask of
    finfo.min, Where(IsNaN(p), 0, p) after the Softmax)"""
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32,
                      attn_implementation="sdpa")
    return LlamaForCausalLM(cfg), {"input_ids": tokens(rng, GLOBAL_B, T)}, tokens(rng, GLOBAL_B, T)


def falcon(rng):
    """multi-query attention: one key/value head shared by every query head, its MatMuls broadcast over the heads
    ([B,1,T,D] against [B,H,D,T]), as Falcon-7B's"""
    from transformers import FalconConfig, FalconForCausalLM
    cfg = FalconConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                       multi_query=True, new_decoder_architecture=False, parallel_attn=True, bias=False,
                       max_position_embeddings=32, attn_implementation="eager")
    return FalconForCausalLM(cfg), {"input_ids": tokens(rng, GLOBAL_B, T)}, tokens(rng, GLOBAL_B, T)


def bert(rng):
    from transformers import BertConfig, BertForMaskedLM
    cfg = BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=64, max_position_embeddings=32, hidden_dropout_prob=0.0,
                     attention_probs_dropout_prob=0.0, attn_implementation="eager")
    return BertForMaskedLM(cfg), {"input_ids": tokens(rng, GLOBAL_B, T)}, tokens(rng, GLOBAL_B, T)


def t5(rng):
    from transformers import T5Config, T5ForConditionalGeneration
    cfg = T5Config(vocab_size=VOCAB, d_model=32, d_kv=16, d_ff=64, num_layers=2, num_decoder_layers=2,
                   num_heads=2, dropout_rate=0.0, decoder_start_token_id=0, attn_implementation="eager")
    return (T5ForConditionalGeneration(cfg),
            {"input_ids": tokens(rng, GLOBAL_B, T), "decoder_input_ids": tokens(rng, GLOBAL_B, T)},
            tokens(rng, GLOBAL_B, T))


def hf_vit(rng):
    from transformers import ViTConfig, ViTForImageClassification
    cfg = ViTConfig(image_size=32, patch_size=8, num_channels=3, hidden_size=32, num_hidden_layers=2,
                    num_attention_heads=2, intermediate_size=64, num_labels=CLASSES, hidden_dropout_prob=0.0,
                    attention_probs_dropout_prob=0.0, attn_implementation="eager")
    return (ViTForImageClassification(cfg), {"pixel_values": images(rng, 32, np.float32)},
            rng.integers(0, CLASSES, GLOBAL_B))


def whisper_enc(rng):
    """an audio encoder: Whisper's conv1d stem (two Conv1d + GELU, the second strided) over log-mel features, then
    transformer layers, mean-pooled into class logits (WhisperForAudioClassification)"""
    from transformers import WhisperConfig, WhisperForAudioClassification
    cfg = WhisperConfig(num_mel_bins=8, d_model=32, encoder_layers=2, encoder_attention_heads=2, encoder_ffn_dim=64,
                        decoder_layers=1, decoder_attention_heads=2, decoder_ffn_dim=64, max_source_positions=8,
                        vocab_size=VOCAB, num_labels=CLASSES, classifier_proj_size=16, attn_implementation="eager")
    feats = rng.standard_normal((GLOBAL_B, 8, 16))  # float64 here: see FLOAT64
    return (WhisperForAudioClassification(cfg), {"input_features": feats},
            rng.integers(0, CLASSES, GLOBAL_B))


def resnet18(rng):
    import torchvision
    return (torchvision.models.resnet18(num_classes=CLASSES), {"x": images(rng, 64, np.float64)},
            rng.integers(0, CLASSES, GLOBAL_B))


def mobilenet_v3_small(rng):
    import torchvision
    return (torchvision.models.mobilenet_v3_small(num_classes=CLASSES, dropout=0.0),
            {"x": images(rng, 64, np.float64)}, rng.integers(0, CLASSES, GLOBAL_B))


def tv_vit(rng):
    from torchvision.models.vision_transformer import VisionTransformer
    m = VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=2, hidden_dim=32, mlp_dim=64,
                          num_classes=CLASSES)
    return m, {"x": images(rng, 32, np.float32)}, rng.integers(0, CLASSES, GLOBAL_B)


class Indexing(nn.Module):
    """torch's indexing as users write it: advanced indexing h[rows, slots] (GatherND), index_put (ScatterND),
    scatter_add into a parameter (ScatterElements, add) and torch.gather (GatherElements), with indices a run
    brings (slots) and constant ones (a buffer)"""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, 16)
        self.proj = nn.Linear(16, 16)
        self.mem = nn.Parameter(torch.zeros(8, 16))
        self.head = nn.Linear(16 * 4 + 16 * 8, CLASSES)
        self.register_buffer("bucket", torch.arange(T) % 8)

    def forward(self, input_ids, slots):
        h = torch.tanh(self.proj(self.emb(input_ids)))  # [B, T, 16]
        b = h.shape[0]
        rows = torch.arange(b).unsqueeze(1).expand_as(slots)
        picked = h[rows, slots]  # [B, 4, 16]
        g = h.index_put((rows, slots), picked * 2.0)  # the slot rows replaced
        idx = self.bucket.view(1, T, 1).expand(b, T, 16)
        pooled = self.mem.unsqueeze(0).expand(b, 8, 16).scatter_add(1, idx, g)  # [B, 8, 16]
        sel = torch.gather(g, 1, slots.unsqueeze(-1).expand(b, 4, 16))  # [B, 4, 16]
        return self.head(torch.tanh(torch.cat([sel.reshape(b, -1), pooled.reshape(b, -1)], 1)))


def indexing(rng):
    slots = np.stack([rng.permutation(T)[:4] for _ in range(GLOBAL_B)]).astype(np.int64)  # unique per row
    return Indexing(), {"input_ids": tokens(rng, GLOBAL_B, T), "slots": slots}, rng.integers(0, CLASSES, GLOBAL_B)


class PaddingIdx(nn.Module):
    """embeddings whose padding_idx row PyTorch's lookup never trains (the exporters drop padding_idx;
    export_torch.py records it in the model's metadata_props), every element in ref.json's final values: tok
    (padding_idx 0) is tied to the output projection, whose gradient still reaches row 0; kind (padding_idx 1, its
    own weight) is looked up by input_ids % 4, so rows 1 and 5 of tok read its pad row"""

    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(8, 4, padding_idx=0)
        self.kind = nn.Embedding(4, 4, padding_idx=1)
        self.head = nn.Linear(4, 8, bias=False)
        self.head.weight = self.tok.weight

    def forward(self, input_ids):
        return self.head(torch.tanh(self.tok(input_ids) + self.kind(input_ids % 4)))


def padding_idx(rng):
    ids = rng.integers(1, 8, (GLOBAL_B, T)).astype(np.int64)
    ids[:, -3:] = 0  # the pad token ends every sample
    return PaddingIdx(), {"input_ids": ids}, rng.integers(0, 8, (GLOBAL_B, T))


class Recurrent(nn.Module):
    """recurrent layers as torch users stack them: a 2-layer bidirectional LSTM over embeddings (batch_first), a
    GRU over its outputs, the GRU's last step into class logits"""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, 16)
        self.lstm = nn.LSTM(16, 12, num_layers=2, batch_first=True, bidirectional=True)
        self.gru = nn.GRU(24, 16, batch_first=True)
        self.head = nn.Linear(16, CLASSES)

    def forward(self, input_ids):
        h, _ = self.lstm(self.emb(input_ids))
        g, _ = self.gru(h)
        return self.head(g[:, -1])


class Upsampler(nn.Module):
    """a convolutional decoder's upsampling as segmentation and generative models write it: a strided Conv2d
    down, ConvTranspose2d back up (stride 2, padding 1, output_padding 1; a grouped one), the pixels pooled into
    class logits"""

    def __init__(self):
        super().__init__()
        self.down = nn.Conv2d(3, 8, 3, stride=2, padding=1)
        self.up = nn.ConvTranspose2d(8, 6, 3, stride=2, padding=1, output_padding=1)
        self.up2 = nn.ConvTranspose2d(6, 6, 4, stride=2, padding=1, groups=2)
        self.head = nn.Linear(6, CLASSES)

    def forward(self, x):
        h = torch.relu(self.up(torch.relu(self.down(x))))
        return self.head(torch.tanh(self.up2(h)).mean((2, 3)))


def upsampler(rng):
    return Upsampler(), {"x": images(rng, 16, np.float32)}, rng.integers(0, CLASSES, GLOBAL_B)


def recurrent(rng):
    return Recurrent(), {"input_ids": tokens(rng, GLOBAL_B, T)}, rng.integers(0, CLASSES, GLOBAL_B)


MODELS = {"mlp": mlp, "nanogpt": nanogpt, "gpt2": gpt2, "llama": llama, "falcon": falcon, "whisper_enc": whisper_enc, "bert": bert, "t5": t5,
          "hf_vit": hf_vit, "resnet18": resnet18, "mobilenet_v3_small": mobilenet_v3_small, "tv_vit": tv_vit,
          "llama_sdpa23": llama_sdpa23, "indexing": indexing, "padding_idx": padding_idx, "recurrent": recurrent,
          "upsampler": upsampler, "llama_sdpa": llama_sdpa}
OPSET = {("llama_sdpa23", "dynamo"): 23}  # else the exporter's default
FLOAT64 = {"resnet18", "mobilenet_v3_small", "whisper_enc"}


def init_params(model, seed):
    """every parameter redrawn by zoo.param_values with the mean and std of its default initialisation;
    returns the recipe, by parameter name"""
    recipe = {}
    with torch.no_grad():
        for i, (name, p) in enumerate(model.named_parameters()):
            mean = float("%.3g" % p.double().mean().item())
            std = float("%.3g" % max(p.double().std().item() if p.numel() > 1 else 0.0, 0.02))
            v = param_values(seed, i, list(p.shape), mean, std, str(p.dtype).replace("torch.", ""))
            p.copy_(torch.from_numpy(v))
            recipe[name] = {"index": i, "shape": list(p.shape), "mean": mean, "std": std}
    return recipe


def externalize(path, model):
    """move the parameters' initializers of the ONNX file into PATH.params (not committed); returns
    [{init, param, offset, length}] and the initializers left inline.  The nodes' metadata_props (the
    dynamo exporter's stack traces and module paths) are dropped."""
    import onnx
    from onnx import numpy_helper
    m = onnx.load(path)
    params = dict(model.named_parameters())
    by_alias = {k: n for n, p in params.items() for k, v in model.state_dict(keep_vars=True).items() if v is p}
    table, inline, off = [], [], 0
    loc = os.path.basename(path) + ".params"
    data = bytearray()
    for t in m.graph.initializer:
        name = by_alias.get(t.name)
        arr = numpy_helper.to_array(t)
        if name is None:  # an exporter's own name for a parameter's value?
            same = [n for n, p in params.items()
                    if tuple(p.shape) == arr.shape and np.array_equal(p.detach().numpy(), arr)]
            name = same[0] if len(same) == 1 else None
        if name is None:
            inline.append(t.name)
            continue
        if not np.array_equal(params[name].detach().numpy(), arr):
            raise SystemExit("%s: initializer %s differs from parameter %s" % (path, t.name, name))
        raw = arr.tobytes()
        off = (len(data) + 63) // 64 * 64
        data += b"\0" * (off - len(data)) + raw
        t.ClearField("raw_data")
        for f in ("float_data", "double_data", "int32_data", "int64_data"):
            t.ClearField(f)
        t.data_location = onnx.TensorProto.EXTERNAL
        del t.external_data[:]
        for k, v in (("location", loc), ("offset", str(off)), ("length", str(len(raw)))):
            e = t.external_data.add()
            e.key, e.value = k, v
        table.append({"init": t.name, "param": name, "offset": off, "length": len(raw)})
    for n in m.graph.node:  # PyTorch's stack traces and module paths: most of the file, no semantics
        del n.metadata_props[:]
    onnx.save(m, path)
    with open(path + ".params", "wb") as f:  # for a check here; the test writes its own
        f.write(bytes(data))
    return table, inline


def versions():
    """the packages the entry was made with (the zoo is regenerated with what PyPI serves)"""
    import onnxscript
    out = {"torch": torch.__version__, "onnxscript": onnxscript.__version__}
    for mod in ("transformers", "torchvision"):
        try:
            out[mod] = __import__(mod).__version__
        except ImportError:
            pass
    return out


def wrap(model, inputs):
    """model's forward made to return its logits as export_torch.py does (wrap_outputs: a Hugging Face model's
    .logits, its inputs by keyword); returns one rank's batch as the export's example inputs"""
    b = GLOBAL_B // WORLD
    args = tuple(torch.from_numpy(v[:b]) for v in inputs.values())
    _, note = export_torch.wrap_outputs(model, args, list(inputs))
    if note:
        print(note)
    return args


def state_records(path):
    """what path's metadata records for fsdpc's --export-safetensors (export_torch.py): the non-persistent
    buffers' initializers, and {a tied parameter's other name: the initializer holding it}"""
    import onnx
    m = onnx.load(path, load_external_data=False)
    k, t = export_torch.NON_PERSISTENT_KEY, export_torch.TIED_KEY
    return ([p.key[len(k):] for p in m.metadata_props if p.key.startswith(k)],
            {p.key[len(t):]: p.value for p in m.metadata_props if p.key.startswith(t)})


def reference(model, inputs, labels, dtype, bf16=False):
    """PyTorch's 3 AdamW steps at world 2 (simulated ranks), the forward and the loss under
    torch.autocast("cpu", dtype=torch.bfloat16) when bf16; the losses"""
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=ADAMW["lr"], betas=(ADAMW["beta1"], ADAMW["beta2"]),
                            eps=ADAMW["eps"], weight_decay=ADAMW["weight_decay"], foreach=False)
    b = GLOBAL_B // WORLD
    losses = []
    for _ in range(STEPS):
        opt.zero_grad(set_to_none=True)
        total = 0.0
        for r in range(WORLD):
            xs = [torch.from_numpy(v[r * b:(r + 1) * b]) for v in inputs.values()]
            y = torch.from_numpy(labels[r * b:(r + 1) * b])
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                logits = model(*xs)
                loss = nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
            (loss / WORLD).backward()
            total += loss.item()
        losses.append(total / WORLD)
        opt.step()
    return losses


def final_weights(model, seed):
    rng = np.random.default_rng(seed + 1000)
    out = {}
    for name, p in model.named_parameters():
        a = p.detach().double().numpy().ravel()
        idx = np.sort(rng.choice(a.size, min(48, a.size), replace=False))
        out[name] = {"idx": idx.tolist(), "vals": [float(v) for v in a[idx]], "absmax": float(np.max(np.abs(a))),
                     "norm": float(np.linalg.norm(a))}
    return out


def generate(name, seed):
    import copy
    out = os.path.join(HERE, name)
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    model, inputs, labels = MODELS[name](rng)
    labels = np.asarray(labels, dtype=np.int64)
    dtype = "float64" if name in FLOAT64 else "float32"
    if dtype == "float64":
        model = model.double()
    model.train()
    recipe = init_params(model, seed)
    for k, v in inputs.items():
        np.save(os.path.join(out, k + ".npy"), v)
    np.save(os.path.join(out, "labels.npy"), labels)
    args = wrap(model, inputs)
    ref = {"seed": seed, "dtype": dtype, "inputs": list(inputs), "world": WORLD, "steps": STEPS,
           "params": recipe, "exports": {}, "versions": versions(),
           "frozen": [n for n, p in model.named_parameters() if not p.requires_grad]}
    for exporter in ("dynamo", "torchscript"):
        path = os.path.join(out, exporter + ".onnx")
        e = {"file": exporter + ".onnx"}
        try:
            notes = export_torch.export(copy.deepcopy(model), args, path, exporter, list(inputs), ["logits"],
                                        OPSET.get((name, exporter)))
            e["notes"] = notes
            e["non_persistent"], e["tied"] = state_records(path)
            e["table"], e["inline"] = externalize(path, model)
        except Exception as ex:  # noqa: BLE001 -- recorded: the exporter's own failure
            msg = str(ex).strip().splitlines()
            e["export_error"] = "%s: %s" % (type(ex).__name__, msg[0] if msg else "")
            for f in (path, path + ".params"):
                if os.path.exists(f):
                    os.remove(f)
        ref["exports"][exporter] = e
        print("%s %s: %s" % (name, exporter, e.get("export_error") or "%d parameters external, inline %s%s"
                             % (len(e["table"]), e["inline"][:6], " " + "; ".join(notes) if notes else "")))
    ref["losses"] = reference(model, inputs, labels, dtype)
    ref["final"] = final_weights(model, seed)
    with open(os.path.join(out, "ref.json"), "w") as f:
        json.dump(ref, f, indent=1)
    print("%s: %d parameters (%d elements), losses %s" % (name, len(recipe), sum(p.numel() for p in
          model.parameters()), ref["losses"]))


def generate_bf16(name):
    """ref.json's "bf16": the same model, batch and recipe trained under torch.autocast(bfloat16) (float32 master
    weights and AdamW, as fsdpc --precision bf16), added to the committed ref.json without exporting again.  The
    model is rebuilt as generate() built it; its inputs must equal the committed ones and its float32 trajectory
    the committed losses (within 1e-6), or this torch/transformers builds another model than the one exported."""
    out = os.path.join(HERE, name)
    with open(os.path.join(out, "ref.json")) as f:
        ref = json.load(f)
    seed = ref["seed"]
    fresh = []
    for _ in range(2):  # one float32 run (the check), one bf16 run, each from the initial weights
        torch.manual_seed(seed)
        rng = np.random.default_rng(seed)
        model, inputs, labels = MODELS[name](rng)
        model.train()
        init_params(model, seed)
        wrap(model, inputs)
        fresh.append((model, inputs, np.asarray(labels, dtype=np.int64)))
    model, inputs, labels = fresh[0]
    for k, v in inputs.items():
        if not np.array_equal(np.load(os.path.join(out, k + ".npy")), v):
            raise SystemExit("%s: input %s differs from the committed one" % (name, k))
    losses = reference(model, inputs, labels, "float32")
    worst = max(abs(a - b) / abs(b) for a, b in zip(losses, ref["losses"]))
    if worst > 1e-6:
        raise SystemExit("%s: float32 losses %s, committed %s: another model than the exported one"
                         % (name, losses, ref["losses"]))
    model, inputs, labels = fresh[1]
    ref["bf16"] = {"losses": reference(model, inputs, labels, "float32", bf16=True),
                   "final": final_weights(model, seed), "torch": torch.__version__}
    with open(os.path.join(out, "ref.json"), "w") as f:
        json.dump(ref, f, indent=1)
    print("%s: float32 as committed (within %.2g); autocast bf16 losses %s" % (name, worst, ref["bf16"]["losses"]))


# the decoders whose ref.json also holds the autocast bf16 trajectory (generate.py --bf16)
DECODERS = ("nanogpt", "gpt2", "llama", "llama_sdpa23", "falcon", "llama_sdpa")


def committed_seed(name, index):
    """the seed of name's committed ref.json (regenerated with the same seed, its inputs and initial values stay
    the same files whatever MODELS' order), else its index in MODELS"""
    try:
        with open(os.path.join(HERE, name, "ref.json")) as f:
            return json.load(f)["seed"]
    except (OSError, KeyError, ValueError):
        return index


def main():
    torch.set_num_threads(1)
    if sys.argv[1:2] == ["--bf16"]:
        for n in sys.argv[2:] or DECODERS:
            generate_bf16(n)
        return
    names = sys.argv[1:] or list(MODELS)
    for n in names:
        if n not in MODELS:
            raise SystemExit("unknown model %s: one of %s" % (n, ", ".join(MODELS)))
    for i, n in enumerate(MODELS):
        if n in names:
            generate(n, committed_seed(n, i))


if __name__ == "__main__":
    main()

"""Exports three models with braze.export and saves eager's outputs beside each package, for
examples/cpp/run_package (make test-install):

    python examples/export_packages.py <dir>

writes <dir>/<model>/ (the package) and <dir>/<model>.cases/cases.txt with raw inputs and
eager outputs at two batch sizes: an MLP (dynamic batch), a ResNet-18-shaped CNN (dynamic
batch) and a small GPT-2 language model (dynamic batch and sequence, with a padding mask)."""
import os
import sys
import warnings

import torch
from torch.export import Dim

import braze

warnings.filterwarnings("ignore")
_NAMES = {torch.float32: "f32", torch.int64: "i64", torch.float64: "f64", torch.int32: "i32",
          torch.float16: "f16", torch.bfloat16: "bf16"}


class Block(torch.nn.Module):
    def __init__(self, c, o, stride):
        super().__init__()
        self.c1 = torch.nn.Conv2d(c, o, 3, stride, 1, bias=False)
        self.b1 = torch.nn.BatchNorm2d(o)
        self.c2 = torch.nn.Conv2d(o, o, 3, 1, 1, bias=False)
        self.b2 = torch.nn.BatchNorm2d(o)
        self.down = None
        if stride != 1 or c != o:
            self.down = torch.nn.Sequential(torch.nn.Conv2d(c, o, 1, stride, bias=False),
                                            torch.nn.BatchNorm2d(o))

    def forward(self, x):
        y = self.b2(self.c2(torch.relu(self.b1(self.c1(x)))))
        return torch.relu(y + (self.down(x) if self.down is not None else x))


class ResNet18ish(torch.nn.Module):
    """ResNet-18's shape (stem, four stages of two basic blocks, pooling, classifier), narrow."""

    def __init__(self, width=16, classes=10):
        super().__init__()
        w = width
        self.stem = torch.nn.Sequential(torch.nn.Conv2d(3, w, 7, 2, 3, bias=False),
                                        torch.nn.BatchNorm2d(w), torch.nn.ReLU(),
                                        torch.nn.MaxPool2d(3, 2, 1))
        stages, c = [], w
        for o, stride in ((w, 1), (2 * w, 2), (4 * w, 2), (8 * w, 2)):
            stages += [Block(c, o, stride), Block(o, o, 1)]
            c = o
        self.stages = torch.nn.Sequential(*stages)
        self.fc = torch.nn.Linear(c, classes)

    def forward(self, x):
        x = torch.nn.functional.adaptive_avg_pool2d(self.stages(self.stem(x)), 1)
        return self.fc(torch.flatten(x, 1))


class LanguageModel(torch.nn.Module):
    """A small GPT-2 returning its logits."""

    def __init__(self):
        super().__init__()
        from transformers import GPT2Config, GPT2LMHeadModel
        cfg = GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=128, n_positions=128,
                         bos_token_id=0, eos_token_id=0)
        self.m = GPT2LMHeadModel(cfg)

    def forward(self, ids, mask):
        return self.m(input_ids=ids, attention_mask=mask, use_cache=False).logits


def models():
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.GELU(), torch.nn.Linear(64, 10))
    cnn = ResNet18ish()
    for mod in cnn.modules():
        if isinstance(mod, torch.nn.BatchNorm2d):
            mod.running_mean.uniform_(-0.5, 0.5)
            mod.running_var.uniform_(0.5, 1.5)
    batch = Dim("batch", min=1, max=64)
    seq = Dim("seq", min=2, max=128)

    def ids(b, s):
        x = torch.randint(0, 128, (b, s))
        mask = torch.ones_like(x)
        mask[0, : s // 4] = 0  # left padding in the first sequence
        return x, mask

    return [
        ("mlp", mlp, lambda b: (torch.randn(b, 16),), {"input": {0: batch}}, (3, 40), 1e-4),
        ("cnn", cnn, lambda b: (torch.randn(b, 3, 64, 64),), {"x": {0: batch}}, (2, 5), 1e-3),
        ("gpt2", LanguageModel(), lambda b: ids(b, 9 + 7 * b), {"ids": {0: batch, 1: seq},
                                                                 "mask": {0: batch, 1: seq}},
         (2, 3), 1e-3),
    ]


def write_cases(model, make, batches, tol, cases):
    """Raw inputs and eager's outputs for run_package, one case per batch size, in `cases`
    (a directory: cases.txt and the raw files; tensors on any device)."""
    os.makedirs(cases, exist_ok=True)
    lines = []
    for b in batches:
        inputs = make(b)
        with torch.no_grad():
            result = model(*inputs)
        outputs = result if isinstance(result, (tuple, list)) else (result,)
        lines.append(f"case batch{b}")
        for kind, tensors in (("in", inputs), ("out", outputs)):
            for k, t in enumerate(tensors):
                file = f"b{b}_{kind}{k}.bin"
                t.detach().cpu().contiguous().view(torch.uint8).numpy().tofile(
                    os.path.join(cases, file))
                dims = " ".join(str(d) for d in t.shape)
                lines.append(f"{kind} {_NAMES[t.dtype]} {t.dim()} {dims} {file}")
        lines.append(f"tol {tol} {tol}")
    with open(os.path.join(cases, "cases.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")


def main(out):
    os.makedirs(out, exist_ok=True)
    for name, model, make, dynamic, batches, tol in models():
        model.eval()
        pkg = os.path.join(out, name)
        braze.export(model, make(batches[0]), pkg, dynamic_shapes=dynamic)
        if name == "mlp":  # and as one file, a package archive
            braze.export(model, make(batches[0]), pkg + ".zip", dynamic_shapes=dynamic)
        write_cases(model, make, batches, tol, os.path.join(out, name + ".cases"))
        print(f"exported {name} to {pkg}")


if __name__ == "__main__":
    main(sys.argv[1])

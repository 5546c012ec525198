"""PyTorch training on synthetic data, printing the workload program's JSON lines
(ARCHITECTURE.md, "Workload"), so that bench/ measures it like tgs-workload.

Run by `tgs bench pytorch` as a plain process (with libtgs.so preloaded when it is in a
TGS container); needs only torch (and torchvision for resnet50). Models:
  resnet50  torchvision's ResNet-50, 224x224 images, SGD
  gpt2      a GPT-2-small-sized decoder (12 layers, 768 wide, 12 heads, 50257 tokens), AdamW
--gap-ms sleeps on the CPU after each step (a data loader's time), which sets the duty;
the warm-up (--warmup-s, before the first report) sleeps it too, so that a job measured
from its first report runs as it warmed up (warmed up without it, a ResNet-50 on an H200
was profiled at three times the progress it then had, and tgsd's first seconds went to
cutting and following its load).
"""
from __future__ import annotations

import argparse
import json
import sys
import time


def build(model: str, batch: int, seq: int):
    import torch
    import torch.nn as nn

    dev = torch.device("cuda")
    if model == "resnet50":
        import torchvision

        net = torchvision.models.resnet50().to(dev, memory_format=torch.channels_last)
        x = torch.randn(batch, 3, 224, 224, device=dev).to(memory_format=torch.channels_last)
        y = torch.randint(0, 1000, (batch,), device=dev)
        opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
        loss_fn = nn.CrossEntropyLoss()

        def step():
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = loss_fn(net(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            return loss

        return step
    if model == "gpt2":
        vocab, width, layers, heads = 50257, 768, 12, 12

        class Decoder(nn.Module):
            def __init__(self):
                super().__init__()
                self.tok = nn.Embedding(vocab, width)
                self.pos = nn.Embedding(seq, width)
                layer = nn.TransformerEncoderLayer(width, heads, 4 * width, dropout=0.0, activation="gelu",
                                                   batch_first=True, norm_first=True)
                self.blocks = nn.TransformerEncoder(layer, layers)
                self.norm = nn.LayerNorm(width)
                self.head = nn.Linear(width, vocab, bias=False)
                self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(seq))

            def forward(self, ids):
                h = self.tok(ids) + self.pos.weight[: ids.shape[1]]
                return self.head(self.norm(self.blocks(h, mask=self.mask, is_causal=True)))

        net = Decoder().to(dev)
        ids = torch.randint(0, vocab, (batch, seq + 1), device=dev)
        opt = torch.optim.AdamW(net.parameters(), lr=1e-4)

        def step():
            with torch.autocast("cuda", dtype=torch.bfloat16):
                logits = net(ids[:, :-1])
                loss = nn.functional.cross_entropy(logits.reshape(-1, vocab).float(), ids[:, 1:].reshape(-1))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            return loss

        return step
    raise SystemExit(f"unknown model {model!r}: expected resnet50 or gpt2")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=("resnet50", "gpt2"), required=True)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--seq", type=int, default=512, help="sequence length (gpt2)")
    p.add_argument("--seconds", type=float, default=30)
    p.add_argument("--warmup-s", type=float, default=3)
    p.add_argument("--gap-ms", type=float, default=0, help="CPU time after each step (sets the duty)")
    p.add_argument("--report-s", type=float, default=1)
    a = p.parse_args(argv)
    import torch

    def emit(obj: dict) -> None:
        sys.stdout.write(json.dumps(obj) + "\n")
        sys.stdout.flush()

    try:
        step = build(a.model, a.batch, a.seq)
        t_end_warm = time.monotonic() + a.warmup_s
        while time.monotonic() < t_end_warm:
            step()
            torch.cuda.synchronize()
            if a.gap_ms:
                time.sleep(a.gap_ms / 1000)
        start = last = time.monotonic()
        it = last_it = 0
        while True:
            loss = step()
            torch.cuda.synchronize()
            it += 1
            if a.gap_ms:
                time.sleep(a.gap_ms / 1000)
            now = time.monotonic()
            if now - last >= a.report_s:
                emit({"iterations_per_s": (it - last_it) / (now - last), "iterations": it, "kernels": 0,
                      "elapsed_s": now - start, "model": a.model})
                last, last_it = now, it
            if now - start >= a.seconds:
                break
        emit({"iterations_per_s": it / (now - start), "iterations": it, "kernels": 0, "elapsed_s": now - start,
              "summary": True, "model": a.model, "loss": float(loss),
              "max_memory_gib": torch.cuda.max_memory_allocated() / 2**30})
    except RuntimeError as e:  # a CUDA error: one JSON line, as the workload program does
        emit({"error": "torch", "cuda_error": str(e).splitlines()[0] if str(e) else repr(e)})
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

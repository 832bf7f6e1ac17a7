"""One rank of a tensor/pipeline-parallel generation run (started by torchrun or mpirun from
tests/gpu/test_parallel_engine.py): loads its shards through warpformer.GPT, runs greedy, beam
and seeded sampling on fixed prompts, and rank 0 saves the results."""

from __future__ import annotations

import argparse
import os

import torch

import warpformer
from warpformer import distributed


def run(model_dir: str, tp: int, pp: int, dtype: torch.dtype, out: str, steps: int,
        prefill_tokens: int | None, rank1_prefill_tokens: int | None) -> None:
    if rank1_prefill_tokens is not None and os.environ.get("RANK") == "1":
        # Failure test: one rank with another prefill group size must stop every rank.
        prefill_tokens = rank1_prefill_tokens

    def load(**options):
        return warpformer.GPT.from_pretrained(model_dir, dtype=dtype, tensor_para_size=tp,
                                              pipeline_para_size=pp, max_batch=8,
                                              max_seq_len=320, backend="cuda",
                                              prefill_tokens=prefill_tokens, **options)

    model = load()
    prompts = torch.load(out + ".prompts")
    res = {}
    g = model.generate(prompts["ids"], steps, input_lengths=prompts["lengths"], end_id=999)
    res["greedy"] = g.sequences.cpu()
    b = model.generate(prompts["ids"][:2], steps // 2, input_lengths=prompts["lengths"][:2],
                       num_beams=4, end_id=999, return_log_probs=True)
    res["beam"] = b.sequences.cpu()
    res["beam_scores"] = b.cum_log_probs.cpu()
    s = model.generate(prompts["ids"], steps, input_lengths=prompts["lengths"], do_sample=True,
                       top_k=40, top_p=0.9, seed=[5, 6, 7, 8], end_id=999)
    res["sample"] = s.sequences.cpu()
    res["logits"] = model.logits(prompts["ids"], prompts["lengths"]).float().cpu()
    # Pipeline stages split runs of >= 8 decode steps into micro-batches (one per stage) when
    # the batch has at least as many rows as stages; these cover the split's edges: uneven
    # micro-batches (3 rows over 2 stages) with penalties (per-row token counts), rows ending
    # early (an end id the greedy run produced at its 4th token, so row 1 stops there), and
    # streaming in calls of 10 steps (a split run of 9, then whole steps).
    ids, lengths = prompts["ids"], prompts["lengths"]
    s3 = model.generate(ids[:3], steps, input_lengths=lengths[:3], do_sample=True, top_k=40,
                        seed=[1, 2, 3], repetition_penalty=1.3, frequency_penalty=0.2,
                        end_id=999, return_log_probs=True)
    res["sample3"] = s3.sequences.cpu()
    res["sample3_log_probs"] = s3.log_probs.cpu()
    eid = int(g.sequences[1, 0, int(lengths[1]) + 3])
    e = model.generate(ids, steps, input_lengths=lengths, end_id=eid)
    res["early_end"] = e.sequences.cpu()
    res["early_end_lengths"] = e.sequence_lengths.cpu()
    if dtype == torch.float32:
        # Hidden states live on the last stage (every rank returns them; rank 0 saves them) and
        # are written per micro-batch of the split steps; row 1 ends early (zeros after).
        h = model.generate(ids, steps, input_lengths=lengths, end_id=eid,
                           return_context_embeddings=True, return_hidden_states=True)
        res["hidden"] = (h.sequences.cpu(), h.context_embeddings.cpu(), h.hidden_states.cpu())
    gen = model.generate_stream(ids, 20, input_lengths=lengths, end_id=999, chunk_size=10)
    res["stream"] = torch.cat(list(gen), dim=1)
    # generate_batches one batch at a time (its own stream) runs on every grid; more batches in
    # flight need a model on one GPU.
    outs = list(model.generate_batches([(ids, lengths), (ids[:2], lengths[:2])], [steps, 9],
                                       end_id=999))
    res["batches"] = [o.sequences.cpu() for o in outs]
    if tp * pp > 1:
        try:
            model.generate_batches([ids], 2, in_flight=2)
        except ValueError as exc:
            res["in_flight_refused"] = str(exc)
    # Kernel launches of the first stage during a 12-step greedy run (1 prefill group, then a
    # run of 11 steps of one embedding per micro-batch): shows whether decode steps were split.
    # An instance without CUDA graphs: every launch its own profiler record.
    eager = load(cuda_graphs=False)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        eager.generate(ids, 12, input_lengths=lengths, end_id=999)
        torch.cuda.synchronize()
    del eager
    res["embedding_launches"] = sum(e.count for e in prof.key_averages()
                                    if "embedding_kernel" in e.key)
    # Teacher-forced logits (fp16 diagnostics) over given sequences, or over this run's greedy
    # ones ("tf_self").
    if "tf_ids" in prompts or prompts.get("tf_self"):
        tf_ids = prompts["tf_ids"] if "tf_ids" in prompts else g.sequences[:, 0].to(torch.int32)
        tf_lengths = prompts["lengths"] + steps
        res["tf_logits"] = model.logits(tf_ids, tf_lengths).float().cpu()
    if dtype == torch.float32:
        # 2,050 prompt tokens: prefill groups of 860, 890 and 300 tokens (the test sets 1,024
        # tokens per group), which pipeline stages pass along as micro-batches.
        g2 = torch.Generator().manual_seed(7)
        ids = torch.randint(3, 1000, (8, 300), generator=g2, dtype=torch.int32)
        lengths = torch.tensor([300, 260, 300, 10, 300, 300, 280, 300], dtype=torch.int32)
        res["grouped_greedy"] = model.generate(ids, 8, input_lengths=lengths,
                                               end_id=999).sequences.cpu()
        res["grouped_logits"] = model.logits(ids, lengths).float().cpu()
    ctx = distributed.get_context()
    if ctx is None or ctx.info.rank == 0:
        torch.save(res, out)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--pp", type=int, default=1)
    ap.add_argument("--dtype", default="fp32")
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--prefill-tokens", type=int, default=None)
    ap.add_argument("--rank1-prefill-tokens", type=int, default=None)
    a = ap.parse_args()
    dtype = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[a.dtype]
    run(a.model_dir, a.tp, a.pp, dtype, a.out, a.steps, a.prefill_tokens,
        a.rank1_prefill_tokens)


if __name__ == "__main__":
    main()

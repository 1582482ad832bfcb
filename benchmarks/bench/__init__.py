"""The bench: `python -m benchmarks.bench` (cli.py: options, the sections run in turn, the
table printed and written to benchmarks/results/).

context.py holds what the sections share (Settings, QUICK, Row, and Bench: one model's
run, its prompts and the rows added); timing.py the interleaved medians and running
requests to completion; report.py the table and the JSON record. Each section is a
function of a Bench in its own module: vs_transformers, tracing, bandwidth, batching,
speculative, prefix_cache, gpu (the Triton kernels), real_model, quantized, memory,
parallel; agreement.py holds the teacher-forced logits and their agreement with a
reference's.
"""

"""Throughput harness: reprobe-jax against PyTorch `transformers` on the same weights (`python -m bench.run`).

pair.py loads both sides and builds real-token inputs; timing.py times calls and measures this machine's roofline
(matmul peak, memory bandwidth); prm.py is the PRM-style step scorer of docs/method.md §A7; cases.py runs the
measurements; report.py checks the goals and writes results.json, results.md and results.png. rl.py times the RL
step's phases, DAPO against SPAE (`python -m bench.rl`, bench_results/rl.json).
"""

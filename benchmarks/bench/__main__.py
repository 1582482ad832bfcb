"""python -m benchmarks.bench [--quick] [--sections ...] [--model ...]: see cli.py."""
from benchmarks.bench.cli import main

main()

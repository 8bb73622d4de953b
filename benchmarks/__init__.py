"""Side-by-side benchmarks; `make bench` (python -m benchmarks) runs them and records results/."""

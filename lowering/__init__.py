"""Lowering: shared IR passes and backends (NumPy codegen, CUDA codegen)."""

"""The offline generation job: the runner (runner.py), the Generator interface (generator.py) and its
local, Ray and replica implementations, input/output (io.py, openai_batch.py), resume and per-record errors.
"""

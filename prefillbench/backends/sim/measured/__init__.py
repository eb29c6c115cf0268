"""Operator, attention, collective and engine-overhead curves fitted to public measured profiles (Vidur,
Sarathi-Serve), each fitted on one part of its data and tested on another; data/README.md says which.

profiles reads the shipped samples (or a Vidur checkout); linear fits the linear-layer and elementwise curves per
profiled GPU. The sim's cost model builds on these; nothing here imports it.
"""

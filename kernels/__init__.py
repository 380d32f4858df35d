"""Compute kernels (installed as ``grammarserve_kernels``): each Triton kernel sits beside the torch
reference implementation that is also its CPU path."""

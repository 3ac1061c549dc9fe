"""SAM 3.1 (Meta's multiplex video tracker) on the runtime: buckets of 16 objects that share one memory.

Modules: config (the one config object, from the manifest), buckets (slot registry of a tracker state),
resize (torch's bilinear resizes in numpy), memory (per-bucket memory pools on the device and Meta's
memory selection), heuristics (detection filtering, IoM association, hotstart), tracker (the frame
loop's phases for 3.1), session (the user API).
"""

"""Many videos on one machine or a cluster: ``sam3track batch`` on Ray.

The driver (:mod:`.driver`, :func:`track_videos`) finds the videos (:mod:`.inputs`; local paths or
object-store URLs, :mod:`.storage`), starts or joins Ray (:mod:`.cluster`), hands one video at a time
to Ray actors each holding one predictor (:mod:`.worker`), and alone writes ``OUT/ledger.jsonl``
(:mod:`.ledger`), so a re-run skips what is done. Ray and fsspec are optional, imported on first use.
Rules, names and measurements: ``docs/batch.md``.
"""

from sam3track.batch.driver import BatchProgress, track_videos
from sam3track.batch.inputs import INPUT_SUFFIXES, OUTPUT_KINDS, collect_inputs, output_name, output_paths
from sam3track.batch.ledger import LEDGER_NAME, VideoSummary, read_ledger
from sam3track.batch.worker import (
    FRAME_DELAY_ENV,
    HOLD_FILE_ENV,
    HOLD_SECONDS,
    MAX_TASK_RETRIES,
    PID_DIR_ENV,
)

__all__ = [
    "BatchProgress",
    "FRAME_DELAY_ENV",
    "HOLD_FILE_ENV",
    "HOLD_SECONDS",
    "INPUT_SUFFIXES",
    "LEDGER_NAME",
    "MAX_TASK_RETRIES",
    "OUTPUT_KINDS",
    "PID_DIR_ENV",
    "VideoSummary",
    "collect_inputs",
    "output_name",
    "output_paths",
    "read_ledger",
    "track_videos",
]

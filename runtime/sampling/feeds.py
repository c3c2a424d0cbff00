"""Where gpu mode's noise comes from: the seed's stream (jetson_unet.model.schedule.NoiseStream, the
spec's order), fed to the GPU ahead of the steps that read it.

HostFeed: NumPy draws the rows on a producer thread into pinned memory; they go up on the copy stream
and the compute stream waits for each upload. DeviceFeed: the GPU draws the same stream bit for bit
(jetson_unet.ops.noise.DeviceNoise), on a side stream beside the steps. Both take a GpuSampler.
"""
from __future__ import annotations

import threading
from typing import Any, List, Sequence

import numpy as np

from jetson_unet.model.schedule import NoiseStream

NOISE_CHUNK = 8            # steps of noise per upload in gpu mode; device noise: rows drawn ahead


def nchw_to_nhwc(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a.transpose(0, 2, 3, 1))


class HostFeed:
    """Host noise: x_T uploaded now; the rows drawn by a producer thread and uploaded on the copy
    stream as they come, the compute stream waiting for each upload before the steps that read it."""

    def __init__(self, sampler: Any, seeds: Sequence[int], n_rows: int, s0: Any) -> None:
        be, ex, c = sampler.backend, sampler.executors[0], sampler.config
        noise = NoiseStream(seeds, (sampler.batch, c.channels, c.image_size, c.image_size))
        ex._host_x[...] = nchw_to_nhwc(noise.draw())
        be.h2d(ex.x_ptr, ex._host_x, s0)
        if sampler._host_noise is None:   # pinned rows, only once host noise is used
            sampler._host_noise = be.pinned((sampler.batch, c.timesteps, sampler.image_elems), np.float32)
        self.sampler, self.uploaded = sampler, 0
        self.producer = _NoiseProducer(noise, sampler._host_noise, n_rows)
        self.producer.start()

    def before_step(self, need: int, s0: Any) -> None:
        """Rows [0, need) must be on the device before the next step."""
        p = self.producer
        ready = p.wait_rows(need) if need > self.uploaded else p.ready
        if ready > self.uploaded:      # whatever the producer has drawn so far goes up now
            self.sampler._upload_rows(self.uploaded, ready, s0)
            self.uploaded = ready

    def after_step(self, need: int) -> None:
        """Nothing to enqueue: the producer thread draws ahead on its own."""

    def halt(self) -> None:
        self.producer.halt()


class DeviceFeed:
    """Device noise on sampler.side (the compute stream itself without graphs): x_T into the
    executor's input (NHWC), then the rows, each drawn at least NOISE_CHUNK rows ahead of the step
    that reads it, in draws of doubling size (1, 1, 2, 4, ... rows, at most the generator's
    capacity), each for every image at once: a draw costs mostly a fixed ~60 us on an H100, so 8
    draws at batch 1 instead of 99, and one set of launches for the batch instead of one per image.
    The compute stream waits on a draw's event between graph replays, never inside the captured
    step."""

    def __init__(self, sampler: Any, seeds: Sequence[int], n_rows: int, s0: Any) -> None:
        be, ex, c, dn = sampler.backend, sampler.executors[0], sampler.config, sampler._dnoise
        dn.seed(seeds, sampler.side)
        dn.draw(ex.x_ptr, sampler.side, nhwc=(c.channels, c.image_size ** 2), images=sampler.batch,
                stride=4 * sampler.image_elems)   # image i's x_T into its part of the NHWC input
        ev = be.event(timing=False)
        ev.record(sampler.side)
        be.wait(s0, ev)
        self.sampler, self.n_rows, self.waited = sampler, n_rows, 0
        self.events: List[Any] = []    # per row: the event of the draw that wrote it

    def before_step(self, need: int, s0: Any) -> None:
        """Rows [0, need) drawn (only what is missing: the first step waits for x_T and row 0, not
        for the rows drawn ahead) and waited for by the compute stream."""
        self._draw(need)
        if need > self.waited:
            self.sampler.backend.wait(s0, self.events[need - 1])
            self.waited = need

    def after_step(self, need: int) -> None:
        """With the step enqueued: rows up to NOISE_CHUNK past it, on sampler.side."""
        self._draw(need + NOISE_CHUNK)

    def _draw(self, upto: int) -> None:
        s = self.sampler
        be, row_bytes, T, drawn = s.backend, 4 * s.image_elems, s.config.timesteps, len(self.events)
        while drawn < min(self.n_rows, upto):
            k = min(max(1, drawn), s._dnoise.rows, self.n_rows - drawn)
            # every image's rows [drawn, drawn + k) of [B][T][C*H*W], image i's at row i * T + drawn
            s._dnoise.draw(s._off["noise"] + row_bytes * drawn, s.side, rows=k, images=s.batch, stride=row_bytes * T)
            ev = be.event(timing=False)
            ev.record(s.side)
            self.events += [ev] * k
            drawn += k

    def halt(self) -> None:
        """Nothing to stop: draws in flight are waited for by run() or close()."""


class _NoiseProducer(threading.Thread):
    """Draws the noisy steps' z in the spec's order straight into pinned rows ([B][T][CHW]: no transpose or
    copy on the host), NOISE_CHUNK rows at a time, ahead of the GPU: NumPy's generator releases the
    GIL while it fills an array, so drawing overlaps the host's launching and the GPU's work."""

    def __init__(self, noise: NoiseStream, host: np.ndarray, n_rows: int) -> None:
        super().__init__(name="noise-producer", daemon=True)
        self.noise, self.host, self.n_rows = noise, host, n_rows
        self.ready, self.error, self._stop_flag = 0, None, False
        self._cond = threading.Condition()

    def run(self) -> None:
        try:
            for r in range(self.n_rows):
                if self._stop_flag:
                    return
                self.noise.draw(out=self.host[:, r])   # image i's row r at host[i, r], as final_conv reads it
                if (r + 1) % NOISE_CHUNK == 0 or r + 1 == self.n_rows:
                    with self._cond:
                        self.ready = r + 1
                        self._cond.notify_all()
        except BaseException as e:   # surfaced in the sampling thread by wait_rows
            with self._cond:
                self.error = e
                self._cond.notify_all()

    def wait_rows(self, k: int) -> int:
        with self._cond:
            while self.ready < k and self.error is None:
                self._cond.wait()
        if self.error is not None:
            raise self.error
        return self.ready

    def halt(self) -> None:
        self._stop_flag = True
        self.join()

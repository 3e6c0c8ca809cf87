/**
 * Reconnect delays: exponential backoff with full jitter.
 *
 * The n-th reconnect in a row (n from 0) waits a uniformly random time in
 * `[0, min(maxMs, initialMs * 2^n))`: 500 ms at most first, doubling, never
 * over 30 s. A connection that stayed live for `resetAfterMs` starts again
 * from the first delay when it ends, so one drop after a long session is
 * retried quickly while a server that keeps failing is not hammered.
 */

export interface BackoffOptions {
  /** The ceiling of the first delay, in ms (500). */
  initialMs?: number;
  /** The largest ceiling, in ms (30,000). */
  maxMs?: number;
  /** A connection live this long resets the sequence, in ms (60,000). */
  resetAfterMs?: number;
  /** A number in [0, 1): `Math.random` (tests pass their own). */
  random?: () => number;
}

export const DEFAULT_BACKOFF = {
  initialMs: 500,
  maxMs: 30_000,
  resetAfterMs: 60_000,
} as const;

export class Backoff {
  readonly initialMs: number;
  readonly maxMs: number;
  readonly resetAfterMs: number;
  private readonly random: () => number;
  private attempt = 0;

  constructor(options: BackoffOptions = {}) {
    this.initialMs = positive("backoff.initialMs", options.initialMs ?? DEFAULT_BACKOFF.initialMs);
    this.maxMs = positive("backoff.maxMs", options.maxMs ?? DEFAULT_BACKOFF.maxMs);
    this.resetAfterMs = positive(
      "backoff.resetAfterMs",
      options.resetAfterMs ?? DEFAULT_BACKOFF.resetAfterMs,
    );
    if (this.maxMs < this.initialMs) {
      throw new RangeError("backoff.maxMs: must be at least backoff.initialMs");
    }
    this.random = options.random ?? Math.random;
  }

  /** Reconnects in a row so far (0 before the first). */
  get attempts(): number {
    return this.attempt;
  }

  /** The ceiling of the next delay, in ms. */
  ceiling(): number {
    // 2^n overflows to Infinity for large n; min() keeps the cap.
    return Math.min(this.maxMs, this.initialMs * 2 ** this.attempt);
  }

  /** The next delay, in ms; counts one more reconnect in a row. */
  next(): number {
    const delay = Math.floor(this.random() * this.ceiling());
    this.attempt += 1;
    return delay;
  }

  /** A connection ended after being live for `liveMs`: reset when it was long enough. */
  ended(liveMs: number): void {
    if (liveMs >= this.resetAfterMs) {
      this.attempt = 0;
    }
  }

  reset(): void {
    this.attempt = 0;
  }
}

function positive(name: string, value: number): number {
  if (!Number.isFinite(value) || value <= 0) {
    throw new RangeError(`${name}: must be a positive number of milliseconds`);
  }
  return value;
}

/**
 * A browser (or Electron renderer) helper that reports idle through `setFocus`.
 *
 * The person is idle when the page is hidden (`visibilitychange`) or when no
 * input (keys, pointer, wheel, touch) arrived for `idleAfterMs`. Each change is
 * sent as `client.setFocus(client.focus.threadIds, { idle })`, so the threads
 * the app focused stay as they are. While a connection is idle, the gateway no
 * longer treats the person as active in their focused threads, and phones stop
 * waiting for the desktop.
 */

import type { Focus, Timers } from "./client.js";

/** The part of `window` / `document` the helper listens to. */
export interface EventSourceLike {
  addEventListener(type: string, listener: () => void, options?: { passive?: boolean; capture?: boolean }): void;
  removeEventListener(type: string, listener: () => void, options?: { capture?: boolean }): void;
}

export interface DocumentLike extends EventSourceLike {
  readonly visibilityState: string;
}

export interface IdleOptions {
  /** No input this long means idle, in ms (5 minutes). */
  idleAfterMs?: number;
  /** Where input events are heard (default: the global `window`). */
  window?: EventSourceLike;
  /** Whose `visibilityState` counts (default: the global `document`). */
  document?: DocumentLike;
  /** Input events that count as activity. */
  events?: readonly string[];
  timers?: Timers;
}

/** What the helper needs of the client (a `BothyClient` fits). */
export interface FocusTarget {
  readonly focus: Focus;
  setFocus(threadIds: readonly string[], options?: { idle?: boolean }): void;
}

export const DEFAULT_IDLE_AFTER_MS = 5 * 60_000;
export const INPUT_EVENTS = ["keydown", "pointerdown", "pointermove", "wheel", "touchstart", "focus"] as const;

/**
 * Start reporting idle for `client`; returns a function that stops (and removes
 * every listener it added). The current state is reported at once when it
 * differs from the client's focus.
 */
export function watchIdle(client: FocusTarget, options: IdleOptions = {}): () => void {
  const g = globalThis as unknown as {
    window?: EventSourceLike;
    document?: DocumentLike;
    setTimeout(callback: () => void, ms: number): unknown;
    clearTimeout(handle: unknown): void;
  };
  const win = options.window ?? g.window;
  const doc = options.document ?? g.document;
  if (win === undefined || doc === undefined) {
    throw new TypeError("watchIdle: no window or document here; pass them in options");
  }
  const idleAfterMs = options.idleAfterMs ?? DEFAULT_IDLE_AFTER_MS;
  if (!Number.isFinite(idleAfterMs) || idleAfterMs <= 0) {
    throw new RangeError("idleAfterMs: must be a positive number of milliseconds");
  }
  const timers: Timers = options.timers ?? {
    setTimeout: (callback, ms) => g.setTimeout(callback, ms),
    clearTimeout: (handle) => g.clearTimeout(handle),
    now: () => Date.now(),
  };
  const events = options.events ?? INPUT_EVENTS;
  let lastInput = timers.now();
  let timer: unknown;
  let stopped = false;

  const idleNow = (): boolean =>
    doc.visibilityState === "hidden" || timers.now() - lastInput >= idleAfterMs;

  const report = (): void => {
    if (stopped) {
      return;
    }
    const idle = idleNow();
    const focus = client.focus;
    if (focus.idle !== idle) {
      client.setFocus(focus.threadIds, { idle });
    }
  };

  const arm = (): void => {
    timers.clearTimeout(timer);
    const left = idleAfterMs - (timers.now() - lastInput);
    timer = timers.setTimeout(check, Math.max(0, left));
  };

  // Checked when the quiet period would end, not on every input event: input
  // only moves `lastInput`, and the timer looks again at what is left.
  const check = (): void => {
    if (stopped) {
      return;
    }
    report();
    if (timers.now() - lastInput < idleAfterMs) {
      arm();
    }
  };

  const onInput = (): void => {
    const wasQuiet = timers.now() - lastInput >= idleAfterMs;
    lastInput = timers.now();
    if (wasQuiet) {
      report();
      arm();
    }
  };

  for (const type of events) {
    win.addEventListener(type, onInput, { passive: true, capture: true });
  }
  doc.addEventListener("visibilitychange", report);
  arm();
  report();

  return () => {
    stopped = true;
    timers.clearTimeout(timer);
    for (const type of events) {
      win.removeEventListener(type, onInput, { capture: true });
    }
    doc.removeEventListener("visibilitychange", report);
  };
}

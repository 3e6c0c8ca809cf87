/**
 * @bothy/notify-client: the Bothy Notify gateway client for desktop and web apps.
 *
 * ```ts
 * import { BothyClient, watchIdle } from "@bothy/notify-client";
 * const client = new BothyClient({ url: "wss://notify.example.com/v1/gateway", getToken });
 * client.on("notification", (n) => showNotification(n));
 * client.start();
 * ```
 */

export {
  BothyClient,
  ConnectionClosedError,
  NotLiveError,
  type BothyClientEvents,
  type BothyClientOptions,
  type ClientState,
  type Focus,
  type StopReason,
  type Timers,
  type WebSocketConstructor,
  type WebSocketLike,
} from "./client.js";
export { Backoff, DEFAULT_BACKOFF, type BackoffOptions } from "./backoff.js";
export { tokenExpiry } from "./token.js";
export {
  DEFAULT_IDLE_AFTER_MS,
  INPUT_EVENTS,
  watchIdle,
  type DocumentLike,
  type EventSourceLike,
  type FocusTarget,
  type IdleOptions,
} from "./idle.js";
export {
  CloseCode,
  ID_PATTERN,
  type NotificationCreated,
  type NotificationPayload,
  type NotificationRemoved,
  type Ready,
  type ReadUpdated,
  type ServerFrame,
  type UnreadThread,
} from "./frames.js";

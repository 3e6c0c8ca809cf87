/**
 * Reading a JWT's `exp` on the client, to `reauth` before it. Nothing is
 * verified here (the server does that); a token whose `exp` cannot be read
 * is simply never renewed in place (the server closes the connection at its
 * expiry with 4001 and the client connects again with a fresh token).
 */

const ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

/** The token's `exp` in Unix seconds, or `undefined` when it has none or is not a JWT. */
export function tokenExpiry(token: string): number | undefined {
  const parts = token.split(".");
  if (parts.length !== 3 || parts[1] === undefined) {
    return undefined;
  }
  const text = base64urlToBinary(parts[1]);
  if (text === undefined) {
    return undefined;
  }
  let claims: unknown;
  try {
    // Bytes as Latin-1 characters: non-ASCII claims come out garbled, but JSON
    // stays valid and `exp` (a number) reads correctly.
    claims = JSON.parse(text);
  } catch {
    return undefined;
  }
  if (typeof claims !== "object" || claims === null) {
    return undefined;
  }
  const exp = (claims as { exp?: unknown }).exp;
  return typeof exp === "number" && Number.isFinite(exp) ? exp : undefined;
}

function base64urlToBinary(segment: string): string | undefined {
  let bits = 0;
  let value = 0;
  let out = "";
  for (const char of segment) {
    const index = ALPHABET.indexOf(char);
    if (index < 0) {
      return undefined;
    }
    value = (value << 6) | index;
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out += String.fromCharCode((value >> bits) & 0xff);
    }
  }
  return out;
}

/**
 * When to renew a token that expires `remainingMs` from now: `marginMs` before
 * its expiry, or halfway for a token shorter than twice the margin (so a short
 * token is renewed in time and a renewal is never due at once).
 */
export function renewalDelay(remainingMs: number, marginMs: number): number {
  if (remainingMs <= 0) {
    return 0;
  }
  return remainingMs >= 2 * marginMs ? remainingMs - marginMs : remainingMs / 2;
}

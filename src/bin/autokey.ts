/**
 * autokey: print a new Fernet key for `crypto_key` (AUTOCONNECT__CRYPTO_KEY / AUTOEND__CRYPTO_KEYS),
 * or, run again, a separate random key for `auth_keys`. To rotate, put the new key first in the list
 * and keep the old ones: `[new,old]`.
 */
import "../../bin/require-node.js" // first: a Node too old for the sources stops here, before the rest loads
import { generateFernetKey } from "../crypto/fernet.ts"

const USAGE = `usage: autokey [--help]

Prints a new random Fernet key (44 characters, URL-safe base64) on one line.
Use it as crypto_key. To rotate keys, list the new key first and keep the old
ones while endpoints made with them may still be in use: crypto_key = [new,old]
Run it again for the endpoint nodes' auth_keys: a key of their own, not the
crypto key. Keep keys in files (umask 077; npm run -s autokey > crypto_key) and
name them with CRYPTO_KEY_FILE / AUTOEND__AUTH_KEYS_FILE, not on command lines.
`

const args = process.argv.slice(2)
if (args.includes("--help") || args.includes("-h")) {
  process.stdout.write(USAGE)
} else if (args.length > 0) {
  process.stderr.write(`autokey: unknown argument ${JSON.stringify(args[0])}\n${USAGE}`)
  process.exitCode = 2
} else {
  process.stdout.write(`${generateFernetKey()}\n`)
}

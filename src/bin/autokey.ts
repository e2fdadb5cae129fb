/**
 * autokey: print a new Fernet key for `crypto_key` (AUTOCONNECT__CRYPTO_KEY / AUTOEND__CRYPTO_KEYS).
 * To rotate, put the new key first in the list and keep the old ones: `[new,old]`.
 */
import { generateFernetKey } from "../crypto/fernet.ts"

const USAGE = `usage: autokey [--help]

Prints a new random Fernet key (44 characters, URL-safe base64) on one line.
Use it as crypto_key. To rotate keys, list the new key first and keep the old
ones while endpoints made with them may still be in use: crypto_key = [new,old]
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

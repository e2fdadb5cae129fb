/**
 * Files only their owner may read (exports, secrets), written through a temporary file beside them
 * that is renamed into place: readers see the old file or the whole new one, never half of one.
 *
 * The temporary file gets a random name and is created exclusively (`wx`: O_CREAT | O_EXCL), so
 * nothing another user planted in a shared directory is followed or written through — a symlink at
 * that name makes the open fail instead of writing to wherever it points. It is mode 0600 from its
 * creation on (and set again, whatever the umask); the rename replaces `path` itself, a symlink at
 * `path` included, never the file it points to.
 */
import { randomBytes } from "node:crypto"
import { type FileHandle, mkdir, open, rename, rm } from "node:fs/promises"
import { dirname } from "node:path"

interface PrivateTemporary {
  /** The temporary file's path: `{path}.{random}.tmp`. */
  readonly path: string
  readonly handle: FileHandle
  /** Close it and rename it over the final path. */
  readonly commit: () => Promise<void>
  /** Close it and remove it (after a failure); never throws. */
  readonly discard: () => Promise<void>
}

/** A new, empty, mode 0600 temporary file for `path` (its directory created if missing). */
export const openPrivateTemporary = async (path: string): Promise<PrivateTemporary> => {
  await mkdir(dirname(path), { recursive: true })
  const temporary = `${path}.${randomBytes(8).toString("hex")}.tmp`
  const handle = await open(temporary, "wx", 0o600)
  let closed = false
  const close = async () => {
    if (closed) return
    closed = true
    await handle.close()
  }
  try {
    await handle.chmod(0o600)
  } catch (error) {
    await close().catch(() => undefined)
    await rm(temporary, { force: true })
    throw error
  }
  return {
    path: temporary,
    handle,
    commit: async () => {
      await close()
      await rename(temporary, path)
    },
    discard: async () => {
      await close().catch(() => undefined)
      await rm(temporary, { force: true }).catch(() => undefined)
    }
  }
}

/** Write `text` to `path` (mode 0600) atomically, through a private temporary file. */
export const writePrivateFile = async (path: string, text: string): Promise<void> => {
  const temporary = await openPrivateTemporary(path)
  try {
    await temporary.handle.writeFile(text)
    await temporary.handle.sync()
    await temporary.commit()
  } catch (error) {
    await temporary.discard()
    throw error
  }
}

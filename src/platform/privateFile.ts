/**
 * Files only their owner may read (exports, secrets), written through a temporary file beside them
 * that is renamed into place: readers see the old file or the whole new one, never half of one.
 *
 * The temporary file gets a random name and is created exclusively (`wx`: O_CREAT | O_EXCL), so
 * nothing another user planted in a shared directory is followed or written through — a symlink at
 * that name makes the open fail instead of writing to wherever it points. It is mode 0600 from its
 * creation on (and set again, whatever the umask); the rename replaces `path` itself, a symlink at
 * `path` included, never the file it points to. A directory made on the way is mode 0700.
 *
 * Also what makes a directory and the files in it private when they already exist with looser
 * modes (`privateDirectory`, `privateExistingFile`): the embedded database's, at every start.
 */
import { randomBytes } from "node:crypto"
import { chmodSync, mkdirSync, statSync } from "node:fs"
import { type FileHandle, mkdir, open, rename, rm } from "node:fs/promises"
import { dirname } from "node:path"

/** The mode bits of the group and of everyone else. */
const OTHERS = 0o077

/** `path` set to `mode` when its group or others had any access; true when they had. */
const restrict = (path: string, mode: number): boolean => {
  if ((statSync(path).mode & OTHERS) === 0) return false
  chmodSync(path, mode)
  return true
}

/**
 * The directory at `path` private to its owner: created mode 0700 (its missing parents too) or, when
 * it exists with access for others, set to 0700; true in that last case.
 */
export const privateDirectory = (path: string): boolean => {
  mkdirSync(path, { recursive: true, mode: 0o700 })
  return restrict(path, 0o700)
}

/** The file at `path`, when there is one, set to 0600 if others had access; true when they had. */
export const privateExistingFile = (path: string): boolean => {
  try {
    return restrict(path, 0o600)
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === "ENOENT") return false
    throw error
  }
}

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
  await mkdir(dirname(path), { recursive: true, mode: 0o700 })
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

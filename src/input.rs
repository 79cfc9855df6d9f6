//! Reading input files: regular files only, never more than a cap, never
//! past the size they had when opened.

/// Largest experiment file read (a sweep makes 4096 cases from a few lines).
pub const MAX_EXPERIMENT_BYTES: u64 = 4 << 20;
/// Largest report, golden or SHA256SUMS read.
pub const MAX_REPORT_BYTES: u64 = 256 << 20;

/// Read a whole input file, refusing one larger than `cap` bytes (so that
/// a mistaken multi-gigabyte file is an error, not an out-of-memory abort)
/// and anything but a regular file (see [`open_regular`]).
pub fn read_capped(path: &std::path::Path, cap: u64) -> std::io::Result<Vec<u8>> {
    let (f, size) = open_regular(path)?;
    if size > cap {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("larger than the {} MiB foldprint reads", cap >> 20),
        ));
    }
    read_open(f, size)
}

/// Read `size` bytes of an open regular file, and not one more.
pub fn read_open(f: std::fs::File, size: u64) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let mut out = Vec::new();
    // Fallible: under a memory limit this is an error (exit 3), not an abort.
    out.try_reserve_exact(size as usize).map_err(|_| {
        std::io::Error::new(
            std::io::ErrorKind::OutOfMemory,
            format!("out of memory reading {size} bytes"),
        )
    })?;
    // Never past the size it had when opened: a file growing under us is
    // not the file we checked.
    f.take(size + 1).read_to_end(&mut out)?;
    if out.len() as u64 != size {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!(
                "changed size while being read ({size} bytes, then {})",
                out.len()
            ),
        ));
    }
    Ok(out)
}

/// Open an input only if it is a regular file, checked on the opened
/// descriptor (no race with a swap). O_NONBLOCK keeps the open of a FIFO
/// from waiting for a writer; a symlink to `/dev/zero` is refused as the
/// device it is. Returns the file and its size.
pub fn open_regular(path: &std::path::Path) -> std::io::Result<(std::fs::File, u64)> {
    use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)?;
    let m = f.metadata()?;
    let ft = m.file_type();
    if !ft.is_file() {
        let kind = if ft.is_dir() {
            "a directory"
        } else if ft.is_fifo() {
            "a fifo"
        } else if ft.is_char_device() {
            "a character device"
        } else if ft.is_block_device() {
            "a block device"
        } else if ft.is_socket() {
            "a socket"
        } else {
            "not a regular file"
        };
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("it is {kind}; foldprint reads only regular files"),
        ));
    }
    Ok((f, m.len()))
}

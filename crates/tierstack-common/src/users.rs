//! The user database: a uid's name (getpwuid_r), for the exporter's labels and the SLURM
//! hooks' group lookup.

use std::ffi::{CStr, CString};

/// The name of `uid` in the user database (NSS: files, LDAP...), or None when it has none.
pub fn user_name(uid: u32) -> Option<CString> {
    let mut buf = vec![0u8; 16384];
    // SAFETY: libc::passwd is a plain C struct of integers and pointers; all-zero is valid.
    let mut pwd: libc::passwd = unsafe { std::mem::zeroed() };
    let mut result: *mut libc::passwd = std::ptr::null_mut();
    // SAFETY: pwd, buf and result are valid for the call; buf's length is passed.
    let rc = unsafe {
        libc::getpwuid_r(
            uid,
            &mut pwd,
            buf.as_mut_ptr().cast(),
            buf.len(),
            &mut result,
        )
    };
    if rc != 0 || result.is_null() || pwd.pw_name.is_null() {
        return None;
    }
    // SAFETY: getpwuid_r succeeded, so pw_name points to a NUL-terminated string in buf.
    let name = unsafe { CStr::from_ptr(pwd.pw_name) }.to_owned();
    (!name.as_bytes().is_empty()).then_some(name)
}

#[cfg(test)]
mod tests {
    #[test]
    fn root_is_named() {
        assert_eq!(super::user_name(0).as_deref(), Some(c"root"));
    }
}

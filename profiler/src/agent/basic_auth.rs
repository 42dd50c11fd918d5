//! HTTP basic authentication against bcrypt hashes, as exporter-toolkit checks it.
//!
//! bcrypt is slow on purpose (tens of milliseconds at cost 10), so a check runs off the
//! serving thread, few at a time, and a user's password that passed is remembered: a
//! Prometheus scraping every few seconds costs one bcrypt, and a client guessing passwords
//! never delays the others' answers.
use std::{
    cell::RefCell,
    collections::{BTreeMap, HashSet},
    sync::Arc,
};

use base64::Engine as _;
use tokio::sync::Semaphore;

/// Checked against when the user is unknown, so that an unknown user takes as long as a
/// wrong password (cost 10, the usual; the password is irrelevant).
const UNKNOWN_USER_HASH: &str = "$2b$10$2z2GEaJ3mSdfm1Ob1UxIyeWAmTP9xk1cV6T1aGrd4y33/8OBGzbIW";
/// Passwords that passed are remembered up to this many; then forgotten all at once.
const REMEMBERED: usize = 64;
/// bcrypt checks running at once.
const CHECKS: usize = 2;

pub struct BasicAuth {
    users: BTreeMap<String, String>,
    passed: RefCell<HashSet<(String, String)>>,
    checks: Arc<Semaphore>,
}

impl BasicAuth {
    /// `users`: name to bcrypt hash. None: everyone is let in.
    pub fn new(users: BTreeMap<String, String>) -> Self {
        BasicAuth {
            users,
            passed: RefCell::default(),
            checks: Arc::new(Semaphore::new(CHECKS)),
        }
    }

    pub fn is_on(&self) -> bool {
        !self.users.is_empty()
    }

    /// Whether a request with this `Authorization` header may be answered.
    pub async fn allows(&self, authorization: Option<&[u8]>) -> bool {
        if !self.is_on() {
            return true;
        }
        let Some((user, password)) = authorization.and_then(credentials) else {
            return false;
        };
        let key = (user, password);
        if self.passed.borrow().contains(&key) {
            return true;
        }
        let (user, password) = key;
        let hash = self
            .users
            .get(&user)
            .cloned()
            .unwrap_or_else(|| UNKNOWN_USER_HASH.to_owned());
        let Ok(_turn) = self.checks.clone().acquire_owned().await else {
            return false;
        };
        let pw = password.clone();
        let matched = tokio::task::spawn_blocking(move || bcrypt::verify(pw, &hash))
            .await
            .is_ok_and(|r| r.unwrap_or(false));
        let ok = matched && self.users.contains_key(&user);
        if ok {
            let mut passed = self.passed.borrow_mut();
            if passed.len() >= REMEMBERED {
                passed.clear();
            }
            passed.insert((user, password));
        }
        ok
    }
}

/// The user and password of a `Basic` authorization.
fn credentials(header: &[u8]) -> Option<(String, String)> {
    let header = std::str::from_utf8(header).ok()?.trim();
    let (scheme, encoded) = header.split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded.trim())
        .ok()?;
    let text = String::from_utf8(decoded).ok()?;
    let (user, password) = text.split_once(':')?;
    Some((user.to_owned(), password.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn basic(user_password: &str) -> Vec<u8> {
        format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(user_password)
        )
        .into_bytes()
    }

    #[test]
    fn credentials_read_from_a_basic_header() {
        assert_eq!(
            credentials(&basic("prom:a:b")),
            Some(("prom".into(), "a:b".into()))
        );
        assert_eq!(credentials(b"Bearer abc"), None);
        assert_eq!(credentials(b"Basic !!!"), None);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn only_the_right_password_of_a_known_user_passes() {
        let users = BTreeMap::from([("prom".to_owned(), bcrypt::hash("s3cret", 4).unwrap())]);
        let auth = BasicAuth::new(users);
        assert!(auth.allows(Some(&basic("prom:s3cret"))).await);
        assert!(auth.allows(Some(&basic("prom:s3cret"))).await, "remembered");
        assert!(!auth.allows(Some(&basic("prom:wrong"))).await);
        assert!(!auth.allows(Some(&basic("other:s3cret"))).await);
        assert!(!auth.allows(None).await);
        assert!(BasicAuth::new(BTreeMap::new()).allows(None).await);
    }

    #[test]
    fn the_unknown_users_hash_is_a_bcrypt_hash() {
        assert!(UNKNOWN_USER_HASH.parse::<bcrypt::HashParts>().is_ok());
    }
}

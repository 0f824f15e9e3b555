//! The TPM 2.0 structures the bootserver reads and writes to attest a machine, in the TPM's
//! own wire format (TPM 2.0 Library, Part 2), and the two pieces of TPM cryptography it does
//! in software:
//! - [`make_credential`]: TPM2_MakeCredential (Part 1, "Credential Protection"): a secret
//!   that only the TPM holding the endorsement key can unwrap, and only for the key whose
//!   name it is bound to (the attestation key);
//! - [`Quote::verify`]: a quote's signature by that attestation key, its qualifying data,
//!   and its PCR digest against the PCR values sent beside it.
//!
//! Only what the agent's TPM tools produce is accepted: RSA 2048 keys with SHA-256 names
//! (the TCG's EK template L-1, `tpm2_createek -G rsa`; an AK from `tpm2_createak -G rsa -g
//! sha256 -s rsassa`), quotes over the SHA-256 bank. Anything else is a clear refusal.

use std::collections::BTreeMap;

use aes::cipher::{BlockEncrypt, KeyInit, generic_array::GenericArray};
use num_bigint::BigUint;
use ring::rand::{SecureRandom, SystemRandom};

/// TPM_ALG_RSA.
const ALG_RSA: u16 = 0x0001;
/// TPM_ALG_SHA256.
const ALG_SHA256: u16 = 0x000B;
/// TPM_ALG_AES.
const ALG_AES: u16 = 0x0006;
/// TPM_ALG_CFB.
const ALG_CFB: u16 = 0x0043;
/// TPM_ALG_NULL.
const ALG_NULL: u16 = 0x0010;
/// TPM_ALG_RSASSA.
const ALG_RSASSA: u16 = 0x0014;
/// TPM_GENERATED_VALUE: the TPM made this structure itself.
const GENERATED: u32 = 0xff54_4347;
/// TPM_ST_ATTEST_QUOTE.
const ST_ATTEST_QUOTE: u16 = 0x8018;
/// The magic and version tpm2-tools writes before a credential blob (`tpm2_makecredential -o`).
const CREDENTIAL_FILE_HEADER: [u8; 8] = [0xba, 0xdc, 0xc0, 0xde, 0, 0, 0, 1];

/// TPMA_OBJECT bits.
mod attribute {
    pub const FIXED_TPM: u32 = 1 << 1;
    pub const FIXED_PARENT: u32 = 1 << 4;
    pub const SENSITIVE_DATA_ORIGIN: u32 = 1 << 5;
    pub const RESTRICTED: u32 = 1 << 16;
    pub const DECRYPT: u32 = 1 << 17;
    pub const SIGN: u32 = 1 << 18;
}

/// Why a TPM structure is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TpmError {
    /// Shorter than its own sizes say, or longer.
    #[error("{0}: malformed (truncated, or bytes left over)")]
    Malformed(&'static str),
    /// A key or structure of a kind the bootserver does not take.
    #[error("{what}: {why}")]
    Unsupported {
        /// Which structure.
        what: &'static str,
        /// What is not supported.
        why: &'static str,
    },
    /// The quote's signature is not the attestation key's.
    #[error("the quote's signature does not verify with the attestation key")]
    BadSignature,
    /// The quote is not over this challenge.
    #[error("the quote is not over this attestation's challenge")]
    WrongQualifyingData,
    /// The PCR values sent do not hash to the quote's digest.
    #[error("the PCR values sent are not the ones the TPM quoted")]
    PcrDigest,
    /// No randomness.
    #[error("the system's random number generator failed")]
    Randomness,
}

/// A reader over TPM wire bytes (big-endian, sizes first).
struct Wire<'a> {
    bytes: &'a [u8],
    what: &'static str,
}

impl<'a> Wire<'a> {
    fn new(bytes: &'a [u8], what: &'static str) -> Self {
        Self { bytes, what }
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], TpmError> {
        if self.bytes.len() < n {
            return Err(TpmError::Malformed(self.what));
        }
        let (head, tail) = self.bytes.split_at(n);
        self.bytes = tail;
        Ok(head)
    }

    fn u8(&mut self) -> Result<u8, TpmError> {
        Ok(self.take(1)?[0])
    }

    fn u16(&mut self) -> Result<u16, TpmError> {
        let b = self.take(2)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }

    fn u32(&mut self) -> Result<u32, TpmError> {
        let b = self.take(4)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    /// A TPM2B: a 16-bit size, then that many bytes.
    fn sized(&mut self) -> Result<&'a [u8], TpmError> {
        let n = self.u16()?;
        self.take(usize::from(n))
    }

    fn end(&self) -> Result<(), TpmError> {
        if self.bytes.is_empty() {
            Ok(())
        } else {
            Err(TpmError::Malformed(self.what))
        }
    }
}

fn sha256(parts: &[&[u8]]) -> [u8; 32] {
    let mut context = ring::digest::Context::new(&ring::digest::SHA256);
    for part in parts {
        context.update(part);
    }
    let mut out = [0u8; 32];
    out.copy_from_slice(context.finish().as_ref());
    out
}

fn push_sized(out: &mut Vec<u8>, bytes: &[u8]) {
    // Every structure built here is far below 64 KiB (a 256-byte modulus at most).
    let size = u16::try_from(bytes.len()).unwrap_or(u16::MAX);
    out.extend_from_slice(&size.to_be_bytes());
    out.extend_from_slice(bytes);
}

/// An RSA public key as the TPM describes it (TPMT_PUBLIC), with its name.
#[derive(Clone, PartialEq, Eq)]
pub struct RsaPublic {
    /// TPMA_OBJECT.
    pub attributes: u32,
    /// The symmetric algorithm of a storage key (the EK's AES-128-CFB): key bits, or `None`.
    pub symmetric_bits: Option<u16>,
    /// The signing scheme (TPM_ALG_*), `ALG_NULL` for none.
    pub scheme: u16,
    /// The scheme's hash.
    pub scheme_hash: u16,
    /// The modulus, big-endian.
    pub modulus: Vec<u8>,
    /// The public exponent.
    pub exponent: u32,
    /// The TPM's name of the key: `000b` and the SHA-256 of the TPMT_PUBLIC.
    pub name: Vec<u8>,
}

impl std::fmt::Debug for RsaPublic {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RsaPublic")
            .field("name", &hex(&self.name))
            .finish_non_exhaustive()
    }
}

pub use unbounded_api::identity::{hex, unhex};

impl RsaPublic {
    /// Reads a TPM2B_PUBLIC (what `tpm2_createek -u` and `tpm2_createak -u` write).
    pub fn parse(tpm2b: &[u8], what: &'static str) -> Result<Self, TpmError> {
        let mut outer = Wire::new(tpm2b, what);
        let area = outer.sized()?;
        outer.end()?;
        let mut w = Wire::new(area, what);
        let unsupported = |why| TpmError::Unsupported { what, why };
        if w.u16()? != ALG_RSA {
            return Err(unsupported("not an RSA key"));
        }
        if w.u16()? != ALG_SHA256 {
            return Err(unsupported("its name algorithm is not SHA-256"));
        }
        let attributes = w.u32()?;
        let _policy = w.sized()?;
        let symmetric_bits = match w.u16()? {
            ALG_NULL => None,
            ALG_AES => {
                let bits = w.u16()?;
                if w.u16()? != ALG_CFB {
                    return Err(unsupported("its symmetric mode is not CFB"));
                }
                Some(bits)
            }
            _ => return Err(unsupported("its symmetric algorithm is not AES")),
        };
        let scheme = w.u16()?;
        let scheme_hash = if scheme == ALG_NULL { 0 } else { w.u16()? };
        let key_bits = w.u16()?;
        let exponent = match w.u32()? {
            0 => 65_537,
            e => e,
        };
        let modulus = w.sized()?.to_vec();
        w.end()?;
        if key_bits != 2048 || modulus.len() != 256 {
            return Err(unsupported("not an RSA 2048 key"));
        }
        let mut name = ALG_SHA256.to_be_bytes().to_vec();
        name.extend_from_slice(&sha256(&[area]));
        Ok(Self {
            attributes,
            symmetric_bits,
            scheme,
            scheme_hash,
            modulus,
            exponent,
            name,
        })
    }

    fn has(&self, bits: u32) -> bool {
        self.attributes & bits == bits
    }

    /// Checks that this is an endorsement-key-like storage key: restricted, decrypting, with
    /// AES-128-CFB (the key MakeCredential wraps a secret to).
    pub fn check_endorsement(&self) -> Result<(), TpmError> {
        use attribute::*;
        let unsupported = |why| TpmError::Unsupported {
            what: "endorsement key",
            why,
        };
        if !self.has(FIXED_TPM | FIXED_PARENT | RESTRICTED | DECRYPT) || self.has(SIGN) {
            return Err(unsupported(
                "not a restricted decryption key fixed to its TPM",
            ));
        }
        if self.symmetric_bits != Some(128) {
            return Err(unsupported("its symmetric key is not AES-128-CFB"));
        }
        Ok(())
    }

    /// Checks that this is an attestation key: created inside the TPM, never leaving it,
    /// restricted to signing what the TPM itself produced, with RSASSA over SHA-256. A key
    /// that is not restricted could sign a forged quote.
    pub fn check_attestation(&self) -> Result<(), TpmError> {
        use attribute::*;
        let unsupported = |why| TpmError::Unsupported {
            what: "attestation key",
            why,
        };
        if !self.has(FIXED_TPM | FIXED_PARENT | SENSITIVE_DATA_ORIGIN | RESTRICTED | SIGN)
            || self.has(DECRYPT)
        {
            return Err(unsupported(
                "not a restricted signing key created in and fixed to its TPM",
            ));
        }
        if self.scheme != ALG_RSASSA || self.scheme_hash != ALG_SHA256 {
            return Err(unsupported("its scheme is not RSASSA with SHA-256"));
        }
        Ok(())
    }
}

/// KDFa (Part 1, 11.4.10.2) with HMAC-SHA-256: `bits` of key from `key`, a label (its
/// terminating zero added here) and two contexts.
fn kdfa(key: &[u8], label: &str, context_u: &[u8], context_v: &[u8], bits: u32) -> Vec<u8> {
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, key);
    let bytes = usize::try_from(bits / 8).unwrap_or(0);
    let mut out = Vec::with_capacity(bytes + 32);
    let mut counter: u32 = 1;
    while out.len() < bytes {
        let mut context = ring::hmac::Context::with_key(&key);
        context.update(&counter.to_be_bytes());
        context.update(label.as_bytes());
        context.update(&[0]);
        context.update(context_u);
        context.update(context_v);
        context.update(&bits.to_be_bytes());
        out.extend_from_slice(context.sign().as_ref());
        counter += 1;
    }
    out.truncate(bytes);
    out
}

/// MGF1 with SHA-256 (RFC 8017, B.2.1).
fn mgf1(seed: &[u8], len: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(len + 32);
    let mut counter: u32 = 0;
    while out.len() < len {
        out.extend_from_slice(&sha256(&[seed, &counter.to_be_bytes()]));
        counter += 1;
    }
    out.truncate(len);
    out
}

/// RSAES-OAEP with SHA-256 (RFC 8017, 7.1.1) of `message` to `key`, with `label`.
fn oaep_encrypt(
    key: &RsaPublic,
    message: &[u8],
    label: &[u8],
    random: &dyn SecureRandom,
) -> Result<Vec<u8>, TpmError> {
    let k = key.modulus.len();
    let h = 32;
    if message.len() + 2 * h + 2 > k {
        return Err(TpmError::Unsupported {
            what: "endorsement key",
            why: "too small for the secret",
        });
    }
    let mut db = Vec::with_capacity(k - h - 1);
    db.extend_from_slice(&sha256(&[label]));
    db.resize(k - message.len() - h - 2, 0);
    db.push(1);
    db.extend_from_slice(message);
    let mut seed = [0u8; 32];
    random.fill(&mut seed).map_err(|_| TpmError::Randomness)?;
    for (d, m) in db.iter_mut().zip(mgf1(&seed, k - h - 1)) {
        *d ^= m;
    }
    for (s, m) in seed.iter_mut().zip(mgf1(&db, h)) {
        *s ^= m;
    }
    let mut encoded = Vec::with_capacity(k);
    encoded.push(0);
    encoded.extend_from_slice(&seed);
    encoded.extend_from_slice(&db);
    let n = BigUint::from_bytes_be(&key.modulus);
    let c = BigUint::from_bytes_be(&encoded).modpow(&BigUint::from(key.exponent), &n);
    let c = c.to_bytes_be();
    let mut out = vec![0u8; k - c.len().min(k)];
    out.extend_from_slice(&c);
    Ok(out)
}

/// AES-128 in CFB mode with a zero IV, as TPM2 protects a credential.
fn aes128_cfb_encrypt(key: &[u8], data: &mut [u8]) -> Result<(), TpmError> {
    let cipher = aes::Aes128::new_from_slice(key).map_err(|_| TpmError::Unsupported {
        what: "credential",
        why: "bad symmetric key length",
    })?;
    let mut feedback = GenericArray::from([0u8; 16]);
    for chunk in data.chunks_mut(16) {
        cipher.encrypt_block(&mut feedback);
        for (byte, key) in chunk.iter_mut().zip(feedback.iter()) {
            *byte ^= key;
        }
        feedback[..chunk.len()].copy_from_slice(chunk);
    }
    Ok(())
}

/// TPM2_MakeCredential in software: `secret` (at most 32 bytes), readable only by
/// TPM2_ActivateCredential in the TPM that holds `endorsement`, for the loaded key named
/// `ak_name`. Returns what tpm2-tools' `tpm2_activatecredential -i` reads: its header, the
/// TPM2B_ID_OBJECT and the TPM2B_ENCRYPTED_SECRET.
pub fn make_credential(
    endorsement: &RsaPublic,
    ak_name: &[u8],
    secret: &[u8],
) -> Result<Vec<u8>, TpmError> {
    make_credential_with(endorsement, ak_name, secret, &SystemRandom::new())
}

fn make_credential_with(
    endorsement: &RsaPublic,
    ak_name: &[u8],
    secret: &[u8],
    random: &dyn SecureRandom,
) -> Result<Vec<u8>, TpmError> {
    endorsement.check_endorsement()?;
    let mut seed = [0u8; 32];
    random.fill(&mut seed).map_err(|_| TpmError::Randomness)?;
    let encrypted_seed = oaep_encrypt(endorsement, &seed, b"IDENTITY\0", random)?;
    let symmetric = kdfa(&seed, "STORAGE", ak_name, &[], 128);
    let mut identity = Vec::with_capacity(secret.len() + 2);
    push_sized(&mut identity, secret);
    aes128_cfb_encrypt(&symmetric, &mut identity)?;
    let hmac_key = kdfa(&seed, "INTEGRITY", &[], &[], 256);
    let mut context =
        ring::hmac::Context::with_key(&ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &hmac_key));
    context.update(&identity);
    context.update(ak_name);
    let integrity = context.sign();
    let mut id_object = Vec::new();
    push_sized(&mut id_object, integrity.as_ref());
    id_object.extend_from_slice(&identity);
    let mut out = CREDENTIAL_FILE_HEADER.to_vec();
    push_sized(&mut out, &id_object);
    push_sized(&mut out, &encrypted_seed);
    Ok(out)
}

/// A quote as `tpm2_quote` writes it: the TPMS_ATTEST (`-m`) and its TPMT_SIGNATURE (`-s`).
#[derive(Debug, Clone)]
pub struct Quote<'a> {
    /// The TPMS_ATTEST bytes.
    pub message: &'a [u8],
    /// The TPMT_SIGNATURE bytes.
    pub signature: &'a [u8],
}

/// What a verified quote says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Quoted {
    /// The SHA-256 PCR values that were quoted, by index.
    pub pcrs: BTreeMap<u8, Vec<u8>>,
    /// The TPM's reset count (boots since its manufacture, for the log).
    pub reset_count: u32,
}

impl Quote<'_> {
    /// Verifies that `ak` signed this quote, that it is over `qualifying`, and that `pcrs`
    /// (SHA-256 values by index, as sent beside it) are the values it covers.
    pub fn verify(
        &self,
        ak: &RsaPublic,
        qualifying: &[u8],
        pcrs: &BTreeMap<u8, Vec<u8>>,
    ) -> Result<Quoted, TpmError> {
        let mut sig = Wire::new(self.signature, "quote signature");
        if sig.u16()? != ALG_RSASSA || sig.u16()? != ALG_SHA256 {
            return Err(TpmError::Unsupported {
                what: "quote signature",
                why: "not RSASSA with SHA-256",
            });
        }
        let signature = sig.sized()?;
        sig.end()?;
        let exponent = ak.exponent.to_be_bytes();
        let first = exponent.iter().position(|b| *b != 0).unwrap_or(3);
        ring::signature::RsaPublicKeyComponents {
            n: ak.modulus.as_slice(),
            e: &exponent[first..],
        }
        .verify(
            &ring::signature::RSA_PKCS1_2048_8192_SHA256,
            self.message,
            signature,
        )
        .map_err(|_| TpmError::BadSignature)?;
        // Signed by a restricted key, so the TPM itself made this structure.
        let mut w = Wire::new(self.message, "quote");
        if w.u32()? != GENERATED || w.u16()? != ST_ATTEST_QUOTE {
            return Err(TpmError::Malformed("quote"));
        }
        let _signer = w.sized()?;
        if w.sized()? != qualifying {
            return Err(TpmError::WrongQualifyingData);
        }
        let _clock = w.take(8)?;
        let reset_count = w.u32()?;
        let _restart_count = w.u32()?;
        let _safe = w.u8()?;
        let _firmware = w.take(8)?;
        let mut selected = Vec::new();
        for _ in 0..w.u32()? {
            let hash = w.u16()?;
            let size = w.u8()?;
            let bitmap = w.take(usize::from(size))?;
            if hash != ALG_SHA256 {
                return Err(TpmError::Unsupported {
                    what: "quote",
                    why: "a PCR bank other than SHA-256",
                });
            }
            for (byte, bits) in bitmap.iter().enumerate() {
                for bit in 0..8 {
                    if bits & (1 << bit) != 0 {
                        selected.push(u8::try_from(byte * 8 + bit).unwrap_or(u8::MAX));
                    }
                }
            }
        }
        let digest = w.sized()?;
        w.end()?;
        selected.sort_unstable();
        let sent: Vec<u8> = pcrs.keys().copied().collect();
        if selected != sent {
            return Err(TpmError::PcrDigest);
        }
        let values: Vec<&[u8]> = pcrs.values().map(Vec::as_slice).collect();
        if sha256(&values) != digest {
            return Err(TpmError::PcrDigest);
        }
        Ok(Quoted {
            pcrs: pcrs.clone(),
            reset_count,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `tpm2_createek -G rsa -u` of an swtpm, and `tpm2_createak -G rsa -g sha256 -s rsassa`
    /// under it; their names as `tpm2_createak -n` and `tpm2_readpublic` printed them.
    pub const EK: &str = include_str!("tpm_test_vectors/ek.pub.hex");
    pub const AK: &str = include_str!("tpm_test_vectors/ak.pub.hex");
    const AK_NAME: &str = include_str!("tpm_test_vectors/ak.name.hex");
    /// A `tpm2_quote -c ak -l sha256:0,1,2,3,4,5,6,7 -q 00112233 -g sha256` of that TPM
    /// (all eight PCRs zero: nothing measured) and its signature.
    const QUOTE: &str = include_str!("tpm_test_vectors/quote.msg.hex");
    const QUOTE_SIG: &str = include_str!("tpm_test_vectors/quote.sig.hex");

    fn key(hex: &str, what: &'static str) -> RsaPublic {
        RsaPublic::parse(&unhex(hex).unwrap(), what).unwrap()
    }

    #[test]
    fn names_are_the_tpm_s_own() {
        let ak = key(AK, "ak");
        assert_eq!(hex(&ak.name), AK_NAME.trim());
        ak.check_attestation().unwrap();
        let ek = key(EK, "ek");
        ek.check_endorsement().unwrap();
        assert!(
            ek.check_attestation().is_err(),
            "an EK is no attestation key"
        );
        assert!(
            ak.check_endorsement().is_err(),
            "an AK is no endorsement key"
        );
    }

    #[test]
    fn malformed_keys_are_refused_not_panicked_on() {
        let bytes = unhex(AK).unwrap();
        for cut in 0..bytes.len() {
            assert!(
                RsaPublic::parse(&bytes[..cut], "ak").is_err(),
                "cut at {cut}"
            );
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(RsaPublic::parse(&longer, "ak").is_err());
    }

    #[test]
    fn a_quote_verifies_only_as_it_was_signed() {
        let ak = key(AK, "ak");
        let message = unhex(QUOTE).unwrap();
        let signature = unhex(QUOTE_SIG).unwrap();
        let zero: BTreeMap<u8, Vec<u8>> = (0..8).map(|i| (i, vec![0u8; 32])).collect();
        let quote = Quote {
            message: &message,
            signature: &signature,
        };
        let quoted = quote.verify(&ak, &[0, 0x11, 0x22, 0x33], &zero).unwrap();
        assert_eq!(quoted.pcrs, zero);
        assert_eq!(
            quote.verify(&ak, &[1, 2, 3, 4], &zero).err(),
            Some(TpmError::WrongQualifyingData)
        );
        let mut other = zero.clone();
        other.insert(4, vec![1u8; 32]);
        assert_eq!(
            quote.verify(&ak, &[0, 0x11, 0x22, 0x33], &other).err(),
            Some(TpmError::PcrDigest),
            "PCR values that are not the quoted ones"
        );
        let mut fewer = zero.clone();
        fewer.remove(&7);
        assert_eq!(
            quote.verify(&ak, &[0, 0x11, 0x22, 0x33], &fewer).err(),
            Some(TpmError::PcrDigest)
        );
        let mut forged = message.clone();
        let last = forged.len() - 1;
        forged[last] ^= 1;
        let forged = Quote {
            message: &forged,
            signature: &signature,
        };
        assert_eq!(
            forged.verify(&ak, &[0, 0x11, 0x22, 0x33], &zero).err(),
            Some(TpmError::BadSignature)
        );
        let ek = key(EK, "ek");
        assert_eq!(
            quote.verify(&ek, &[0, 0x11, 0x22, 0x33], &zero).err(),
            Some(TpmError::BadSignature),
            "another key"
        );
    }

    #[test]
    fn kdfa_and_cfb_match_their_definitions() {
        // KDFa's first block is one HMAC over counter, label, 0, contexts and bit count.
        let one = kdfa(b"key", "STORAGE", b"u", b"v", 128);
        let mut input = 1u32.to_be_bytes().to_vec();
        input.extend_from_slice(b"STORAGE\0uv");
        input.extend_from_slice(&128u32.to_be_bytes());
        let block = ring::hmac::sign(
            &ring::hmac::Key::new(ring::hmac::HMAC_SHA256, b"key"),
            &input,
        );
        assert_eq!(one, block.as_ref()[..16]);
        assert_eq!(kdfa(b"key", "INTEGRITY", &[], &[], 512).len(), 64);
        // CFB: the first block is the plaintext XOR E(0), the next XOR E(first ciphertext).
        let key = [7u8; 16];
        let mut data = [0u8; 20];
        aes128_cfb_encrypt(&key, &mut data).unwrap();
        let cipher = aes::Aes128::new_from_slice(&key).unwrap();
        let mut block = GenericArray::from([0u8; 16]);
        cipher.encrypt_block(&mut block);
        assert_eq!(data[..16], block[..]);
        let mut next = block;
        cipher.encrypt_block(&mut next);
        assert_eq!(data[16..], next[..4]);
    }

    #[test]
    fn a_credential_has_tpm2_tools_layout() {
        let ek = key(EK, "ek");
        let blob = make_credential(&ek, &unhex(AK_NAME).unwrap(), &[9u8; 32]).unwrap();
        let mut w = Wire::new(&blob, "credential");
        assert_eq!(w.take(8).unwrap(), CREDENTIAL_FILE_HEADER);
        let id_object = w.sized().unwrap();
        assert_eq!(
            id_object.len(),
            2 + 32 + 2 + 32,
            "HMAC, then the sized secret"
        );
        assert_eq!(w.sized().unwrap().len(), 256, "the seed, RSA-encrypted");
        w.end().unwrap();
        let again = make_credential(&ek, &unhex(AK_NAME).unwrap(), &[9u8; 32]).unwrap();
        assert_ne!(blob, again, "a fresh seed each time");
        let ak = key(AK, "ak");
        assert!(
            make_credential(&ak, &ak.name, &[9u8; 32]).is_err(),
            "only to an EK"
        );
    }
}

package pdf

import (
	"bytes"
	"crypto/aes"
	"crypto/cipher"
	"crypto/md5"
	"crypto/rc4"
	"crypto/sha256"
	"crypto/sha512"
	"fmt"
	"math"
)

// Decryption with the empty user password. A file encrypted by the
// Standard security handler with no user password (the common case: an
// owner password that only restricts printing or copying) opens in every
// reader without a password, so its text is read like any other file's.
// This file computes the file key as pdf.js does (src/core/crypto.js,
// CipherTransformFactory), for RC4 (/V 1, 2; /V 4 with /CFM /V2), AES-128
// (/V 4, /CFM /AESV2) and AES-256 (/V 5, /R 5 and /R 6, ISO 32000-2
// algorithm 2.B), and decrypts streams with the per-object keys. Where
// pdf.js departs from the specification (a key length taken from /Length
// whatever /V says, a /V 4 key padded to 16 bytes) it is followed: the
// point is to read what a reader reads.
//
// A file whose user password is not empty cannot be read by the provider
// either: it is costed by its size, as before (scan.go).
//
// The encryption dictionary and the file id are looked for in every
// trailer and cross-reference stream dictionary of the file, and the
// dictionary in every object of that number (plain, or in an object stream
// that is not encrypted), as a reader rebuilding a damaged file would; each
// combination is tried, and the empty password checked against /U. Every
// key that opens the file is used (a file no writer makes may have two);
// past maxHandlers of them, or when too many candidates leave none that
// opens, the file is over the bound.

// pwPadding pads passwords (algorithm 2, step a).
var pwPadding = []byte{
	0x28, 0xbf, 0x4e, 0x5e, 0x4e, 0x75, 0x8a, 0x41, 0x64, 0x00, 0x4e, 0x56,
	0xff, 0xfa, 0x01, 0x08, 0x2e, 0x2e, 0x00, 0xb6, 0xd0, 0x68, 0x3e, 0x80,
	0x2f, 0x0c, 0xa9, 0xfe, 0x64, 0x53, 0x69, 0x7a,
}

type cryptMethod int

const (
	cryptNone cryptMethod = iota // identity: the data is not encrypted
	cryptRC4
	cryptAESV2
	cryptAESV3
)

// secHandler is an opened Standard security handler: the file key and how
// streams are encrypted.
type secHandler struct {
	v       int
	key     []byte
	stmf    pdfName
	methods map[pdfName]cryptMethod // the crypt filters of /CF (V 4 and 5)
}

// Bounds of the search for an encryption that opens.
const (
	maxCandidates = 16 // encryption dictionaries, and file ids, tried
	maxHandlers   = 4  // distinct keys that open the file
	maxTrailers   = 64 // trailer and xref stream dictionaries read
	maxObjTries   = 8  // objects of one number tried
)

// jsNumber reads a number as pdf.js's dictionary values are: ok is false
// for anything that is no number.
func jsNumber(v any) (float64, bool) {
	switch v := v.(type) {
	case int64:
		return float64(v), true
	case float64:
		return v, true
	}
	return math.NaN(), false
}

// jsInt32 is JavaScript's ToInt32, what pdf.js's bit operations apply.
func jsInt32(v any) int32 {
	f, ok := jsNumber(v)
	if !ok || math.IsNaN(f) || math.IsInf(f, 0) {
		return 0
	}
	return int32(uint32(int64(math.Mod(math.Trunc(f), 1<<32))))
}

// falsy reports whether v is a value JavaScript reads as false (a missing
// key, 0, false, an empty string).
func falsy(v any) bool {
	switch v := v.(type) {
	case nil:
		return true
	case int64:
		return v == 0
	case float64:
		return v == 0 || math.IsNaN(v)
	case bool:
		return !v
	case string:
		return v == ""
	}
	return false
}

// newHandler opens the encryption dictionary enc with the empty user
// password and the file id; it returns nil when the password does not open
// it or pdf.js would refuse the dictionary. deref resolves an indirect
// value.
func newHandler(enc dict, id []byte, deref func(any) any) *secHandler {
	get := func(k pdfName) any { return deref(enc[k]) }
	if get("Filter") != pdfName("Standard") {
		return nil
	}
	vf, ok := jsNumber(get("V"))
	if !ok || vf != 1 && vf != 2 && vf != 4 && vf != 5 {
		return nil
	}
	v := int(vf)
	var keyLen float64
	if kl := get("Length"); !falsy(kl) {
		if keyLen, ok = jsNumber(kl); !ok {
			return nil
		}
	} else if v <= 3 {
		keyLen = 40
	} else {
		cf, ok1 := get("CF").(dict)
		stmf, ok2 := get("StmF").(pdfName)
		if !ok1 || !ok2 {
			return nil
		}
		hd, _ := deref(cf[stmf]).(dict)
		l := hd["Length"]
		if hd != nil {
			l = deref(l)
		}
		keyLen = 128
		if !falsy(l) {
			if keyLen, ok = jsNumber(l); !ok {
				return nil
			}
		}
		if keyLen < 40 {
			keyLen = float64(jsInt32(keyLen) << 3)
		}
	}
	if keyLen != math.Trunc(keyLen) || keyLen < 40 || math.Mod(keyLen, 8) != 0 || keyLen > 1<<16 {
		return nil
	}
	o, ok1 := get("O").(string)
	u, ok2 := get("U").(string)
	if !ok1 || !ok2 {
		return nil
	}
	r, _ := jsNumber(get("R")) // NaN when missing: every comparison fails, as in JavaScript
	encMeta := (v == 4 || v == 5) && get("EncryptMetadata") != false
	var key []byte
	if v != 5 {
		key = r4Key(id, []byte(o[:min(32, len(o))]), []byte(u[:min(32, len(u))]),
			jsInt32(get("P")), r, int(keyLen)>>3, encMeta)
	} else {
		_, ok1 := get("OE").(string)
		ue, ok2 := get("UE").(string)
		_, ok3 := get("Perms").(string)
		if !ok1 || !ok2 || !ok3 {
			return nil
		}
		key = r6Key([]byte(u), []byte(ue), r == 6)
	}
	if key == nil {
		return nil
	}
	if v == 4 && len(key) < 16 {
		key = append(key, make([]byte, 16-len(key))...)
	}
	h := &secHandler{v: v, key: key}
	if v >= 4 {
		h.stmf = "Identity"
		if s := get("StmF"); !falsy(s) {
			h.stmf, _ = s.(pdfName) // a value that is no name: pdf.js fails to read any stream
		}
		h.methods = map[pdfName]cryptMethod{}
		if cf, ok := get("CF").(dict); ok {
			for name, e := range cf {
				if len(h.methods) >= 64 {
					break
				}
				ed, _ := deref(e).(dict)
				cfm, _ := deref(ed["CFM"]).(pdfName)
				switch cfm {
				case "V2":
					h.methods[name] = cryptRC4
				case "AESV2":
					h.methods[name] = cryptAESV2
				case "AESV3":
					h.methods[name] = cryptAESV3
				}
			}
		}
	}
	return h
}

// r4Key is algorithms 2 and 6 (with pdf.js's reading of odd values): the
// file key of revisions 2 to 4 for the empty password, or nil when /U
// says the password is wrong. n is the key length in bytes.
func r4Key(id, o, u []byte, p int32, r float64, n int, encMeta bool) []byte {
	buf := make([]byte, 0, 32+len(o)+4+len(id)+4)
	buf = append(buf, pwPadding...)
	buf = append(buf, o...)
	buf = append(buf, byte(p), byte(p>>8), byte(p>>16), byte(p>>24))
	buf = append(buf, id...)
	if r >= 4 && !encMeta {
		buf = append(buf, 0xff, 0xff, 0xff, 0xff)
	}
	h := md5.Sum(buf)
	if r >= 3 {
		// pdf.js hashes n bytes of the 16-byte digest: zeros past it.
		in := make([]byte, n)
		for i := 0; i < 50; i++ {
			clear(in)
			copy(in, h[:])
			h = md5.Sum(in)
		}
	}
	key := append([]byte(nil), h[:min(n, 16)]...)
	var check []byte
	if r >= 3 {
		sum := md5.Sum(append(append([]byte(nil), pwPadding...), id...))
		check = sum[:]
		dk := make([]byte, len(key))
		for j := 0; j <= 19; j++ {
			for k := range key {
				dk[k] = key[k] ^ byte(j)
			}
			c, _ := rc4.NewCipher(dk)
			c.XORKeyStream(check, check)
		}
	} else {
		check = append([]byte(nil), pwPadding...)
		c, _ := rc4.NewCipher(key)
		c.XORKeyStream(check, check)
	}
	if len(u) < len(check) || !bytes.Equal(u[:len(check)], check) {
		return nil
	}
	return key
}

// r6Key is algorithm 2.A for the empty password: the file key of
// revisions 5 and 6 (AES-256), or nil when /U says the password is wrong.
func r6Key(u, ue []byte, r6 bool) []byte {
	if len(u) < 32 {
		return nil
	}
	part := func(a, b int) []byte { return u[min(a, len(u)):min(b, len(u))] }
	hash := func(in []byte) []byte {
		if r6 {
			return hash2B(nil, in, nil)
		}
		s := sha256.Sum256(in)
		return s[:]
	}
	if !bytes.Equal(hash(part(32, 40)), u[:32]) {
		return nil
	}
	k := hash(part(40, 48))
	block, _ := aes.NewCipher(k)
	key := make([]byte, len(ue)/16*16)
	cipher.NewCBCDecrypter(block, make([]byte, 16)).CryptBlocks(key, ue[:len(key)])
	// pdf.js sets the first 32 bytes of a zeroed key.
	out := make([]byte, 32)
	copy(out, key)
	return out
}

// hash2B is algorithm 2.B of ISO 32000-2: the hash of in for password pw
// and user key data udata (empty but for an owner password).
func hash2B(pw, in, udata []byte) []byte {
	s := sha256.Sum256(in)
	k := s[:]
	var e []byte
	for i := 0; i < 64 || int(e[len(e)-1]) > i-32; i++ {
		k1 := bytes.Repeat(append(append(append([]byte(nil), pw...), k...), udata...), 64)
		block, _ := aes.NewCipher(k[:16])
		e = make([]byte, len(k1))
		cipher.NewCBCEncrypter(block, k[16:32]).CryptBlocks(e, k1)
		sum := 0
		for _, c := range e[:16] {
			sum += int(c)
		}
		switch sum % 3 {
		case 0:
			s := sha256.Sum256(e)
			k = s[:]
		case 1:
			s := sha512.Sum384(e)
			k = s[:]
		default:
			s := sha512.Sum512(e)
			k = s[:]
		}
	}
	return k[:32]
}

// method says how the streams of an object are encrypted; name is a crypt
// filter a stream names itself, or "" for the default.
func (h *secHandler) method(name pdfName) cryptMethod {
	if h.v < 4 {
		return cryptRC4
	}
	if name == "" {
		name = h.stmf
	}
	return h.methods[name]
}

// objectKey is algorithm 1: the key of object num, generation gen.
func (h *secHandler) objectKey(num, gen int, aesSalt bool) []byte {
	buf := append([]byte(nil), h.key...)
	buf = append(buf, byte(num), byte(num>>8), byte(num>>16), byte(gen), byte(gen>>8))
	if aesSalt {
		buf = append(buf, "sAlT"...)
	}
	s := md5.Sum(buf)
	return s[:min(len(h.key)+5, 16)]
}

// decrypt returns the plaintext of a stream of object num, generation gen,
// as pdf.js decrypts it (AES: the first block is the IV, an incomplete last
// block is dropped, valid padding removed). ok is false when the stream is
// not encrypted (its data is the plaintext).
func (h *secHandler) decrypt(raw []byte, num, gen int, name pdfName, b *budget) (out []byte, ok bool, err error) {
	m := h.method(name)
	switch m {
	case cryptRC4:
		out = make([]byte, len(raw))
		c, _ := rc4.NewCipher(h.objectKey(num, gen, false))
		c.XORKeyStream(out, raw)
	case cryptAESV2, cryptAESV3:
		key := h.key
		if m == cryptAESV2 {
			key = h.objectKey(num, gen, true)
		}
		if len(raw) < 32 {
			return nil, true, b.charge(0)
		}
		block, _ := aes.NewCipher(key)
		body := raw[16:]
		out = make([]byte, len(body)/16*16)
		cipher.NewCBCDecrypter(block, raw[:16]).CryptBlocks(out, body[:len(out)])
		if ps := int(out[len(out)-1]); ps <= 16 {
			last := out[len(out)-16:]
			for i := 15; i >= 16-ps; i-- {
				if int(last[i]) != ps {
					ps = 0
					break
				}
			}
			out = out[:len(out)-ps]
		}
	default:
		return nil, false, nil
	}
	return out, true, b.charge(len(out))
}

// key identifies what a handler decrypts with.
func (h *secHandler) id() string {
	return fmt.Sprint(h.v, h.key, h.stmf, h.methods)
}

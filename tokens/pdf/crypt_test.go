package pdf

import (
	"bytes"
	"crypto/aes"
	"crypto/cipher"
	"crypto/md5"
	"crypto/rc4"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

// The Standard security handler, written here from the specification
// (ISO 32000-2, 7.6.4), to build encrypted files for the tests.

type encKind struct {
	name    string
	v, r    int
	bits    int    // key length (V 1 to 4)
	cfm     string // V 4: V2 or AESV2
	userPW  string // "" for a file that opens without a password
	encMeta bool   // V 4: /EncryptMetadata (false writes it)
}

var encKinds = []encKind{
	{name: "RC4-40 R2", v: 1, r: 2, bits: 40},
	{name: "RC4-128 R3", v: 2, r: 3, bits: 128},
	{name: "RC4-128 R4 crypt filter", v: 4, r: 4, bits: 128, cfm: "V2", encMeta: true},
	{name: "AESV2 R4", v: 4, r: 4, bits: 128, cfm: "AESV2", encMeta: true},
	{name: "AESV2 R4 clear metadata", v: 4, r: 4, bits: 128, cfm: "AESV2"},
	{name: "AESV3 R5", v: 5, r: 5},
	{name: "AESV3 R6", v: 5, r: 6},
}

type encrypter struct {
	kind encKind
	id   []byte
	key  []byte
	dict string // the encryption dictionary
}

func padPW(pw string) []byte { return append([]byte(pw), pwPadding...)[:32] }

func rc4Bytes(key, data []byte) []byte {
	c, _ := rc4.NewCipher(key)
	out := make([]byte, len(data))
	c.XORKeyStream(out, data)
	return out
}

func md5Bytes(parts ...[]byte) []byte {
	s := md5.Sum(bytes.Join(parts, nil))
	return s[:]
}

func aesCBC(key, iv, data []byte) []byte {
	block, _ := aes.NewCipher(key)
	out := make([]byte, len(data))
	cipher.NewCBCEncrypter(block, iv).CryptBlocks(out, data)
	return out
}

func newEncrypter(k encKind) *encrypter {
	e := &encrypter{kind: k, id: []byte("0123456789abcdef")}
	const p = -3904
	if k.v == 5 {
		e.key = bytes.Repeat([]byte{0x5a, 0x17}, 16)
		hash := func(pw, in, udata []byte) []byte {
			if k.r == 6 {
				return hash2B(pw, in, udata)
			}
			s := sha256.Sum256(in)
			return s[:]
		}
		pw := []byte(k.userPW)
		uvs, uks := []byte("uvsalt01"), []byte("uksalt02")
		u := bytes.Join([][]byte{hash(pw, bytes.Join([][]byte{pw, uvs}, nil), nil), uvs, uks}, nil)
		ue := aesCBC(hash(pw, bytes.Join([][]byte{pw, uks}, nil), nil), make([]byte, 16), e.key)
		opw := []byte("owner")
		ovs, oks := []byte("ovsalt03"), []byte("oksalt04")
		o := bytes.Join([][]byte{hash(opw, bytes.Join([][]byte{opw, ovs, u}, nil), u), ovs, oks}, nil)
		oe := aesCBC(hash(opw, bytes.Join([][]byte{opw, oks, u}, nil), u), make([]byte, 16), e.key)
		perms := []byte{byte(p & 0xff), byte(p >> 8 & 0xff), 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 'T', 'a', 'd', 'b', 1, 2, 3, 4}
		block, _ := aes.NewCipher(e.key)
		block.Encrypt(perms, perms)
		e.dict = fmt.Sprintf("<< /Filter /Standard /V 5 /R %d /Length 256 /CF << /StdCF << /CFM /AESV3 /AuthEvent /DocOpen /Length 32 >> >> "+
			"/StmF /StdCF /StrF /StdCF /O <%x> /U <%x> /OE <%x> /UE <%x> /Perms <%x> /P %d >>", k.r, o, u, oe, ue, perms, p)
		return e
	}
	n := k.bits / 8
	if k.r == 2 {
		n = 5
	}
	// Algorithm 3: /O, from the owner password "owner".
	okey := md5Bytes(padPW("owner"))
	if k.r >= 3 {
		for i := 0; i < 50; i++ {
			okey = md5Bytes(okey[:n])
		}
	}
	okey = okey[:n]
	o := rc4Bytes(okey, padPW(k.userPW))
	if k.r >= 3 {
		for i := 1; i <= 19; i++ {
			x := make([]byte, n)
			for j := range x {
				x[j] = okey[j] ^ byte(i)
			}
			o = rc4Bytes(x, o)
		}
	}
	// Algorithm 2: the file key.
	pb := []byte{byte(p & 0xff), byte(p >> 8 & 0xff), byte(p >> 16 & 0xff), byte(p >> 24 & 0xff)}
	in := bytes.Join([][]byte{padPW(k.userPW), o, pb, e.id}, nil)
	if k.r >= 4 && !k.encMeta {
		in = append(in, 0xff, 0xff, 0xff, 0xff)
	}
	h := md5Bytes(in)
	if k.r >= 3 {
		for i := 0; i < 50; i++ {
			h = md5Bytes(h[:n])
		}
	}
	e.key = h[:n]
	// Algorithms 4 and 5: /U.
	var u []byte
	if k.r == 2 {
		u = rc4Bytes(e.key, pwPadding)
	} else {
		u = rc4Bytes(e.key, md5Bytes(pwPadding, e.id))
		for i := 1; i <= 19; i++ {
			x := make([]byte, n)
			for j := range x {
				x[j] = e.key[j] ^ byte(i)
			}
			u = rc4Bytes(x, u)
		}
		u = append(u, bytes.Repeat([]byte{0x11}, 16)...)
	}
	switch k.v {
	case 4:
		meta := ""
		if !k.encMeta {
			meta = "/EncryptMetadata false"
		}
		e.dict = fmt.Sprintf("<< /Filter /Standard /V 4 /R 4 /Length 128 /CF << /StdCF << /CFM /%s /AuthEvent /DocOpen /Length 16 >> >> "+
			"/StmF /StdCF /StrF /StdCF /O <%x> /U <%x> /P %d %s >>", k.cfm, o, u, p, meta)
	case 1:
		e.dict = fmt.Sprintf("<< /Filter /Standard /V 1 /R 2 /O <%x> /U <%x> /P %d >>", o, u, p)
	default:
		e.dict = fmt.Sprintf("<< /Filter /Standard /V %d /R %d /Length %d /O <%x> /U <%x> /P %d >>", k.v, k.r, k.bits, o, u, p)
	}
	return e
}

// stream encrypts the data of a stream of object num (generation 0).
func (e *encrypter) stream(num int, data []byte) []byte {
	objKey := func(salt bool) []byte {
		x := append(append([]byte(nil), e.key...), byte(num), byte(num>>8), byte(num>>16), 0, 0)
		if salt {
			x = append(x, "sAlT"...)
		}
		return md5Bytes(x)[:min(len(e.key)+5, 16)]
	}
	aesOf := func(key []byte) []byte {
		pad := 16 - len(data)%16
		plain := append(append([]byte(nil), data...), bytes.Repeat([]byte{byte(pad)}, pad)...)
		iv := md5Bytes([]byte(fmt.Sprint("iv", num)))
		return append(iv, aesCBC(key, iv, plain)...)
	}
	switch {
	case e.kind.v == 5:
		return aesOf(e.key)
	case e.kind.cfm == "AESV2":
		return aesOf(objKey(true))
	}
	return rc4Bytes(objKey(false), data)
}

// encryptedPDF is a one-page file whose content shows content, encrypted
// as k says; packed puts the page objects in an (encrypted) object stream.
func encryptedPDF(k encKind, content string, packed bool) []byte {
	e := newEncrypter(k)
	d := newDoc()
	c := d.reserve()
	d.set(c, streamBody("/Filter /FlateDecode", e.stream(c, zlibBytes([]byte(content)))))
	p := d.page(c)
	d.finish("")
	enc := d.add(e.dict)
	trailer := fmt.Sprintf("/Encrypt %d 0 R /ID [<%x> <%x>]", enc, e.id, e.id)
	if packed {
		d.pack(d.catalog, d.pages, d.font, p)
		d.encrypt, d.xrefExtra = e.stream, trailer
		return d.xrefStream(d.catalog)
	}
	return d.table(d.catalog, trailer)
}

// TestEncryptedEmptyPassword: a file encrypted with no user password is
// decrypted and read, whatever its algorithm, with or without object
// streams, with its xref intact or broken.
func TestEncryptedEmptyPassword(t *testing.T) {
	content, text := bigTextContent()
	want := strings.Join(strings.Fields(text), " ")
	for _, k := range encKinds {
		for _, packed := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s packed=%v", k.name, packed), func(t *testing.T) {
				data := encryptedPDF(k, content, packed)
				if len(data) > 4<<10 {
					t.Errorf("%d-byte file", len(data))
				}
				broken := bytes.Replace(data, []byte("startxref\n"), []byte("startxref\n9"), 1)
				for _, in := range [][]byte{data, broken} {
					o := readAllText(t, in, testLimits)
					if o.err != nil {
						t.Fatalf("err %v", o.err)
					}
					got := strings.Join(strings.Fields(o.text), " ")
					if !strings.Contains(got, want[:len(want)-100]) {
						t.Errorf("read %d bytes of text of %d, result %+v: %.200q", len(got), len(want), o.res, got)
					}
					if o.res.Pages != 1 || o.res.Unread > int64(len(in))/2 {
						t.Errorf("result %+v for %d bytes", o.res, len(in))
					}
					t.Logf("%d-byte file, path %v: %d bytes of text, result %+v", len(in), o.how, len(got), o.res)
				}
			})
		}
	}
}

// TestEncryptedUserPassword: a file that needs a password no reader has is
// costed by its size (the provider cannot read it either).
func TestEncryptedUserPassword(t *testing.T) {
	content, _ := bigTextContent()
	for _, k := range encKinds {
		k.userPW = "secret"
		data := encryptedPDF(k, content, false)
		o := readAllText(t, data, testLimits)
		if o.err != nil || o.res.Unread < int64(len(data))/2 || strings.Contains(o.text, "quick brown") {
			t.Errorf("%s: err %v result %+v, %d bytes of text", k.name, o.err, o.res, len(o.text))
		}
	}
}

// TestEncryptedClearStream: a stream an encrypted file stores in the clear
// (an Identity crypt filter) is read too.
func TestEncryptedClearStream(t *testing.T) {
	k := encKinds[3] // AESV2
	e := newEncrypter(k)
	d := newDoc()
	c1 := d.reserve()
	d.set(c1, streamBody("/Filter [/Crypt /FlateDecode] /DecodeParms [<< /Name /Identity >> null]", zlibBytes([]byte(show("stored in the clear")))))
	c2 := d.reserve()
	d.set(c2, streamBody("/Filter /FlateDecode", e.stream(c2, zlibBytes([]byte(show("stored encrypted"))))))
	d.page(c1, c2)
	d.finish("")
	enc := d.add(e.dict)
	data := d.table(d.catalog, fmt.Sprintf("/Encrypt %d 0 R /ID [<%x> <%x>]", enc, e.id, e.id))
	o := readAllText(t, data, testLimits)
	if o.err != nil {
		t.Fatal(o.err)
	}
	wantWords(t, o.text, "stored in the clear", "stored encrypted")
}

// TestEncryptionDecoys: keys hidden among many candidate dictionaries
// still open the file, or the bound is passed; a file whose key is found
// in an old trailer only is read.
func TestEncryptionDecoys(t *testing.T) {
	content, _ := bigTextContent()
	data := encryptedPDF(encKinds[1], content, false)
	// Decoy trailers before the real one, each naming another dictionary.
	var decoys bytes.Buffer
	for i := 0; i < 40; i++ {
		fmt.Fprintf(&decoys, "%%trailer\n<< /Encrypt << /Filter /Standard /V 2 /R 3 /Length 128 /O <%064x> /U <%064x> /P %d >> /ID [<%032x>] >>\n", i, i, -i, i)
	}
	i := bytes.Index(data, []byte("1 0 obj"))
	withDecoys := append(append(append([]byte(nil), data[:i]...), decoys.Bytes()...), data[i:]...)
	withDecoys = bytes.Replace(withDecoys, []byte("startxref\n"), []byte("startxref\n9"), 1)
	o := readAllText(t, withDecoys, testLimits)
	if o.err != nil || !strings.Contains(o.text, "quick brown") {
		t.Errorf("decoys before: err %v result %+v, %d bytes of text", o.err, o.res, len(o.text))
	}
	// After it: too many to try; the bound.
	withDecoys = append(append([]byte(nil), data...), decoys.Bytes()...)
	o = readAllText(t, withDecoys, testLimits)
	if o.err == nil && !strings.Contains(o.text, "quick brown") {
		t.Errorf("decoys after: err %v result %+v, %d bytes of text", o.err, o.res, len(o.text))
	}
}

func mustHex(s string) string {
	b, err := hex.DecodeString(s)
	if err != nil {
		panic(err)
	}
	return string(b)
}

// TestSecurityHandlerVectors checks the key computation against pdf.js's
// test dictionaries (test/unit/crypto_spec.js): those that open without a
// password, and those that do not.
func TestSecurityHandlerVectors(t *testing.T) {
	id1 := []byte(mustHex("f6c6af17f372528d524d9a80d1efdf18"))
	id2 := []byte(mustHex("3c4c5f3a4496af409a9db33c781c76ac"))
	deref := func(v any) any { return v }
	aesDict := func(r int64, u, ue string) dict {
		return dict{"Filter": pdfName("Standard"), "V": int64(5), "R": r, "Length": int64(256),
			"O": strings.Repeat("\x00", 48), "U": mustHex(u), "OE": strings.Repeat("\x00", 32), "UE": mustHex(ue),
			"Perms": strings.Repeat("\x00", 16), "P": int64(-1084)}
	}
	for _, c := range []struct {
		name string
		enc  dict
		id   []byte
		open bool
	}{
		{"R3 with a user password", dict{"Filter": pdfName("Standard"), "V": int64(2), "Length": int64(128), "R": int64(3), "P": int64(-1028),
			"O": mustHex("80c30496916f20736c3ae61b135491f20d5612e3ff5ebbe9564fd86b9aca7c5d"),
			"U": mustHex("6a0c8d3e591900bc6a647d91bdaa001800000000000000000000000000000000")}, id1, false},
		{"R4 without", dict{"Filter": pdfName("Standard"), "V": int64(4), "Length": int64(128), "R": int64(4), "P": int64(-1084),
			"O": mustHex("734614762e793527db970a3522b3e1d4adbd9b3cb4a5897515b259f168d9e9f4"),
			"U": mustHex("930489a9bf8a45a688a2dbc2a0a8676e00000000000000000000000000000000")}, id2, true},
		{"R5 with", aesDict(5, "83f28fa057028a864ffdbdade04990f1be51c50ff96991970fc24103017ebbdd75a904209f6516dca85ed7c06426bc28",
			"2396c3a9f53333ff9e9e21f2e74b7dbe197eac72c3f489f5eaa52a4a3c261111"), id1, false},
		{"R6 with", aesDict(6, "5ee6cd4ba663fa4cdb801155391121a4962e67b0a09cbbe9a6dfa3fd93eb5fb853f59265c6f722c6bf0b105eedd814af",
			"79d002b5e6599c3cfd8fd41c54b4c4b1ad80dd6b2e145eba87335f1814dffe24"), id1, false},
		{"R5 without", aesDict(5, "83d47a69f14f30963112cc82cbcabf3579fd21ebe4d1b51dd6fa14f3be8f7173ef88dee2e8dcf535e4b816c8148d651e",
			"81f55db02881e47f5f7c8f8562a07e10d0886c787b7e4a5e9132b664122705f6"), id1, true},
		{"R6 without", aesDict(6, "1aa9dc913883936b295b1137b136dbe88efe28e589d40ead123b7d4e5f3666657a8b471805594f687d5a48a35a87172a",
			"a00a5a55271d272c0bfe0ea24cf9625ea1b9d6763762b236a94e99f1a4446571"), id1, true},
	} {
		h := newHandler(c.enc, c.id, deref)
		if (h != nil) != c.open {
			t.Errorf("%s: opens %v, want %v", c.name, h != nil, c.open)
		}
	}
	// Algorithm 2.B with a password and user data: pdf.js's PDF20 vector
	// (the key of the user password "user").
	salt := []byte{191, 11, 16, 94, 237, 216, 20, 175}
	ue := []byte{121, 208, 2, 181, 230, 89, 156, 60, 253, 143, 212, 28, 84, 180, 196, 177, 173, 128, 221, 107, 46, 20, 94, 186, 135, 51, 95, 24, 20, 223, 254, 36}
	want := []byte{42, 218, 213, 39, 73, 91, 72, 79, 67, 38, 248, 133, 18, 189, 61, 34, 107, 79, 29, 56, 59, 181, 213, 118, 113, 34, 65, 210, 87, 174, 22, 239}
	k := hash2B([]byte("user"), append([]byte("user"), salt...), nil)
	block, _ := aes.NewCipher(k)
	got := make([]byte, 32)
	cipher.NewCBCDecrypter(block, make([]byte, 16)).CryptBlocks(got, ue)
	if !bytes.Equal(got, want) {
		t.Errorf("algorithm 2.B: key %x, want %x", got, want)
	}
}

// TestEncryptionBounded: the search for keys and the decryption stay
// within the budget and the deadline.
func TestEncryptionBounded(t *testing.T) {
	k := encKinds[6] // R6: the costliest key check
	e := newEncrypter(k)
	var buf bytes.Buffer
	buf.WriteString("%PDF-1.7\n")
	// Many R6 dictionaries, none of which opens.
	for i := 0; i < 200; i++ {
		fmt.Fprintf(&buf, "trailer\n<< /Encrypt %s >>\n", strings.Replace(e.dict, "/U <", fmt.Sprintf("/U <%02x", i), 1))
	}
	// Many copies of the objects the trailers name, each large.
	var objs bytes.Buffer
	objs.WriteString("%PDF-1.7\n")
	big := strings.Repeat("0 ", 20000)
	for i := 0; i < 300; i++ {
		fmt.Fprintf(&objs, "%d 0 obj << /Filter /Standard /V 2 /R 3 /Length 128 /O <00> /U <00> /P %d 0 R /X [%s] >> endobj\n", i%20, i%7, big)
	}
	for i := 0; i < 100; i++ {
		fmt.Fprintf(&objs, "trailer << /Encrypt %d 0 R /ID [%d 0 R] >>\n", i%20, i%13)
	}
	lim := testLimits
	lim.Timeout = 200 * time.Millisecond
	for _, data := range [][]byte{buf.Bytes(), objs.Bytes()} {
		start := time.Now()
		_, err := Read(data, lim, func([]byte) error { return nil })
		if took := time.Since(start); took > time.Second || err != nil && !errors.Is(err, ErrBound) {
			t.Errorf("err %v after %v", err, took)
		}
		t.Logf("%d bytes: %v in %v", len(data), err, time.Since(start))
	}
}

// TestEncryptedToUnicode: an encrypted file is read by the scan, which
// knows no fonts; a ToUnicode CMap that maps each code to many characters
// still counts them.
func TestEncryptedToUnicode(t *testing.T) {
	e := newEncrypter(encKinds[1])
	d := newDoc()
	long := strings.Repeat("0041004200430044", 12) // 48 characters a code
	cmap := fmt.Sprintf("/CIDInit /ProcSet findresource begin 12 dict begin begincmap\n1 begincodespacerange <00> <FF> endcodespacerange\n1 beginbfchar <01> <%s> endbfchar\nendcmap end end", long)
	tu := d.reserve()
	d.set(tu, streamBody("/Filter /FlateDecode", e.stream(tu, zlibBytes([]byte(cmap)))))
	f := d.add(fmt.Sprintf("<< /Type /Font /Subtype /Type1 /BaseFont /X /ToUnicode %d 0 R >>", tu))
	c := d.reserve()
	d.set(c, streamBody("/Filter /FlateDecode", e.stream(c, zlibBytes([]byte("BT /F2 9 Tf <"+strings.Repeat("01", 5000)+"> Tj ET")))))
	d.page(c)
	d.finish(fmt.Sprintf("<< /Font << /F2 %d 0 R >> >>", f))
	enc := d.add(e.dict)
	data := d.table(d.catalog, fmt.Sprintf("/Encrypt %d 0 R /ID [<%x> <%x>]", enc, e.id, e.id))
	o := readAllText(t, data, testLimits)
	if o.err != nil || strings.Count(o.text, "ABCD") < 5000*12 {
		t.Fatalf("%d-byte file: err %v result %+v, %d bytes of text", len(data), o.err, o.res, len(o.text))
	}
	// The same file in the clear, on the library path, reads the same.
	d2 := newDoc()
	tu = d2.flate("", []byte(cmap))
	f = d2.add(fmt.Sprintf("<< /Type /Font /Subtype /Type1 /BaseFont /X /ToUnicode %d 0 R >>", tu))
	d2.textPage("BT /F2 9 Tf <"+strings.Repeat("01", 5000)+"> Tj ET", true)
	d2.finish(fmt.Sprintf("<< /Font << /F2 %d 0 R >> >>", f))
	o2 := readAllText(t, d2.table(d2.catalog, ""), testLimits)
	if o2.err != nil || o2.how != viaLibrary || len(o2.text) != len(o.text) {
		t.Errorf("in the clear: err %v path %v, %d bytes of text, encrypted %d", o2.err, o2.how, len(o2.text), len(o.text))
	}
}

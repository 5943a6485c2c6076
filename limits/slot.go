package limits

import "strings"

// SlotCount is the number of hash slots of a Redis Cluster.
const SlotCount = 16384

// Slot is the Redis Cluster hash slot of key, as Redis computes it: CRC16
// (XMODEM) of the key modulo 16384, where a non-empty {hash tag} — the
// text between the first '{' and the first '}' after it — stands for the
// whole key.
func Slot(key string) int {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	return int(crc16(key)) % SlotCount
}

// crc16 is CRC-16/XMODEM (polynomial 0x1021, initial value 0), the
// checksum Redis Cluster hashes keys with.
func crc16(s string) uint16 {
	var crc uint16
	for i := 0; i < len(s); i++ {
		crc ^= uint16(s[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc
}

package io.mnemoflow.conformance;

import java.nio.charset.StandardCharsets;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;
import java.util.ArrayList;
import java.util.List;

/** The pure functions of docs/PROTOCOL.md: §3 partitioner, §4 fingerprint, Appendix C ids. */
final class Protocol {
    private Protocol() {}

    /** §3: murmur2 exactly as printed in the document (32-bit wrapping arithmetic). */
    static int murmur2(byte[] data) {
        final int m = 0x5bd1e995, r = 24;
        int length = data.length;
        int h = 0x9747b28c ^ length;
        for (int i = 0; i < length / 4; i++) {
            int i4 = i * 4;
            int k = (data[i4] & 0xff) | (data[i4 + 1] & 0xff) << 8
                    | (data[i4 + 2] & 0xff) << 16 | (data[i4 + 3] & 0xff) << 24;
            k *= m;
            k ^= k >>> r;
            k *= m;
            h *= m;
            h ^= k;
        }
        int tail = length & ~3;
        switch (length % 4) {
            case 3:
                h ^= (data[tail + 2] & 0xff) << 16;
                // fall through
            case 2:
                h ^= (data[tail + 1] & 0xff) << 8;
                // fall through
            case 1:
                h ^= data[tail] & 0xff;
                h *= m;
                break;
            default:
                break;
        }
        h ^= h >>> 13;
        h *= m;
        h ^= h >>> 15;
        return h;
    }

    /** §3: partition(key, n) = (murmur2(utf8(key)) & 0x7fffffff) % n. */
    static int partition(String key, int numPartitions) {
        return (murmur2(key.getBytes(StandardCharsets.UTF_8)) & 0x7fffffff) % numPartitions;
    }

    // §4: CRC-64-AVRO (the Rabin fingerprint of the Avro specification)
    static final long EMPTY = 0xc15d213aa4d7a795L;
    private static final long[] TABLE = new long[256];

    static {
        for (int i = 0; i < 256; i++) {
            long fp = i;
            for (int j = 0; j < 8; j++) {
                fp = (fp >>> 1) ^ (EMPTY & -(fp & 1L));
            }
            TABLE[i] = fp;
        }
    }

    static long crc64Avro(byte[] bytes) {
        long fp = EMPTY;
        for (byte b : bytes) {
            fp = (fp >>> 8) ^ TABLE[(int) (fp ^ b) & 0xff];
        }
        return fp;
    }

    /** Appendix C: kind + ":" + first 24 hex of sha256(utf8(join(U+001F, parts))). */
    static String stableId(String kind, Object... parts) {
        List<String> texts = new ArrayList<>();
        for (Object p : parts) {
            texts.add(String.valueOf(p));
        }
        return kind + ":" + sha256Hex(String.join("\u001f", texts)).substring(0, 24);
    }

    static String sha256Hex(String text) {
        try {
            byte[] d = MessageDigest.getInstance("SHA-256").digest(text.getBytes(StandardCharsets.UTF_8));
            return hex(d);
        } catch (NoSuchAlgorithmException e) {
            throw new IllegalStateException(e);
        }
    }

    static String hex(byte[] bytes) {
        StringBuilder sb = new StringBuilder(bytes.length * 2);
        for (byte b : bytes) {
            sb.append(Character.forDigit((b >> 4) & 0xf, 16)).append(Character.forDigit(b & 0xf, 16));
        }
        return sb.toString();
    }

    static byte[] unhex(String s) {
        byte[] out = new byte[s.length() / 2];
        for (int i = 0; i < out.length; i++) {
            out[i] = (byte) Integer.parseInt(s.substring(2 * i, 2 * i + 2), 16);
        }
        return out;
    }
}

/*
 * A stand-in for Huawei's DCMI library (libdcmi.so) on a machine without Ascend NPUs.
 *
 * The ascend handler loads DCMI through ctypes; to test that path for real, the tests build this
 * file with the C compiler into a shared library that exports the functions the handler calls,
 * with the signatures, struct layouts and return codes of Huawei's dcmi_interface_api.h (0 on
 * success, DCMI_ERR_CODE_* below -8000 on failure). Written for these tests; no Huawei code is
 * in it.
 *
 * Its state comes from the text file named by ASCEND_DCMI_STATE, read again on every call, so a
 * test faults a chip while the handler runs. vNPUs made through dcmi_create_vdevice go to
 * <state>.created (vdev lines, so the test's rewrites of the state keep them) and their node
 * /dev/vdavinci<id> to the directory ASCEND_DCMI_DEV_DIR names; dcmi_set_destroy_vdevice
 * removes both (only of vNPUs made that way); a template the chip has no AI cores or memory
 * left for is refused with DCMI_ERR_CODE_INNER_ERR (a stand-in choice). Lines (anything else is ignored):
 *   chip <card> <dev> <logic> <phy> <type> <name> <ver> <aicore> <hbm_mb> <mem_mb> <health>
 *        <error codes, comma-separated hex, or -> <pcie domain> <bus> <device> <function>
 *        [<RoCE port address, IPv4 or IPv6, or -> [<RoCE link check result, or ->]]
 *   vdev <card> <dev> <vdev id> <template name> <aicore> <memory_mb> <vfg id> <status>
 *        <in a container: 0 or 1>   a vNPU an admin created on that chip (npu-smi set -t
 *                                   create-vnpu), read through dcmi_get_device_info
 *                                   (DCMI_MAIN_CMD_VDEV_MNG)
 *   fail <function name> <return code>
 *   hang <function name> <card>     the call blocks while this line is there (card -1: calls
 *                                   without a card, or every card), as DCMI can after a card
 *                                   drops; it re-reads the state every 20 ms, at most 10 min
 */
#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_CARD_NUM 64
#define MAX_CHIP_NAME_LEN 32
#define MAX_CHIPS 256
#define MAX_ERRORS 16
#define MAX_FAILS 32
#define MAX_HANGS 32
#define MAX_VDEVS 128
#define HANG_POLL_NS 20000000L
#define HANG_MAX_POLLS 30000

#define DCMI_OK 0
#define DCMI_ERR_CODE_INVALID_PARAMETER (-8001)
#define DCMI_ERR_CODE_INNER_ERR (-8005)
#define DCMI_ERR_CODE_INVALID_DEVICE_ID (-8007)
#define DCMI_ERR_CODE_NOT_REDAY (-8012)
#define DCMI_ERR_CODE_NOT_SUPPORT (-8255)

enum dcmi_ip_addr_type { DCMI_IPADDR_TYPE_V4 = 0, DCMI_IPADDR_TYPE_V6 = 1, DCMI_IPADDR_TYPE_ANY = 2 };

struct dcmi_ip_addr {
    union {
        unsigned char ip6[16];
        unsigned char ip4[4];
    } u_addr;
    enum dcmi_ip_addr_type ip_type;
};

enum dcmi_port_type { DCMI_VNIC_PORT = 0, DCMI_ROCE_PORT = 1, DCMI_INVALID_PORT };

enum dcmi_rdfx_detect_result {
    DCMI_RDFX_DETECT_OK = 0,
    DCMI_RDFX_DETECT_SOCK_FAIL = 1,
    DCMI_RDFX_DETECT_RECV_TIMEOUT = 2,
    DCMI_RDFX_DETECT_UNREACH = 3,
    DCMI_RDFX_DETECT_TIME_EXCEEDED = 4,
    DCMI_RDFX_DETECT_FAULT = 5,
    DCMI_RDFX_DETECT_INIT = 6,
    DCMI_RDFX_DETECT_THREAD_ERR = 7,
    DCMI_RDFX_DETECT_IP_SET = 8,
    DCMI_RDFX_DETECT_MAX = 0xFF
};

struct dcmi_chip_info {
    unsigned char chip_type[MAX_CHIP_NAME_LEN];
    unsigned char chip_name[MAX_CHIP_NAME_LEN];
    unsigned char chip_ver[MAX_CHIP_NAME_LEN];
    unsigned int aicore_cnt;
};

struct dcmi_hbm_info {
    unsigned long long memory_size;
    unsigned int freq;
    unsigned long long memory_usage;
    int temp;
    unsigned int bandwith_util_rate;
};

struct dcmi_get_memory_info_stru {
    unsigned long long memory_size;
    unsigned long long memory_available;
    unsigned int freq;
    unsigned long hugepagesize;
    unsigned long hugepages_total;
    unsigned long hugepages_free;
    unsigned int utiliza;
    unsigned char reserve[60];
};

/* Virtual devices (vNPUs), as dcmi_interface_api.h declares them. */
#define DCMI_VDEV_RES_NAME_LEN 16
#define DCMI_VDEV_SIZE 20
#define DCMI_VDEV_FOR_RESERVE 32
#define DCMI_SOC_SPLIT_MAX 32
#define DCMI_MAIN_CMD_VDEV_MNG 52
#define DCMI_VMNG_SUB_CMD_GET_VDEV_RESOURCE 0
#define DCMI_VMNG_SUB_CMD_GET_TOTAL_RESOURCE 1
#define DCMI_VMNG_SUB_CMD_GET_FREE_RESOURCE 2

struct dcmi_base_resource {
    unsigned long long token;
    unsigned long long token_max;
    unsigned long long task_timeout;
    unsigned int vfg_id;
    unsigned char vip_mode;
    unsigned char reserved[DCMI_VDEV_FOR_RESERVE - 1];
};

struct dcmi_computing_resource {
    float aic;
    float aiv;
    unsigned short dsa, rtsq, acsq, cdqm, c_core, ffts, sdma, pcie_dma;
    unsigned long long memory_size; /* MB */
    unsigned int event_id, notify_id, stream_id, model_id;
    unsigned short topic_schedule_aicpu, host_ctrl_cpu, host_aicpu, device_aicpu,
        topic_ctrl_cpu_slot;
    unsigned int vdev_aicore_utilization;
    unsigned long long vdev_memory_total;
    unsigned long long vdev_memory_free;
    unsigned char reserved[DCMI_VDEV_FOR_RESERVE - DCMI_VDEV_SIZE];
};

struct dcmi_media_resource {
    float jpegd, jpege, vpc, vdec, pngd, venc;
    unsigned char reserved[DCMI_VDEV_FOR_RESERVE];
};

struct dcmi_vdev_query_info {
    char name[DCMI_VDEV_RES_NAME_LEN];
    unsigned int status;
    unsigned int is_container_used;
    unsigned int vfid;
    unsigned int vfg_id;
    unsigned long long container_id;
    struct dcmi_base_resource base;
    struct dcmi_computing_resource computing;
    struct dcmi_media_resource media;
};

struct dcmi_vdev_query_stru {
    unsigned int vdev_id;
    struct dcmi_vdev_query_info query_info;
};

struct dcmi_soc_free_resource {
    unsigned int vfg_num;
    unsigned int vfg_bitmap;
    struct dcmi_base_resource base;
    struct dcmi_computing_resource computing;
    struct dcmi_media_resource media;
};

struct dcmi_soc_total_resource {
    unsigned int vdev_num;
    unsigned int vdev_id[DCMI_SOC_SPLIT_MAX];
    unsigned int vfg_num;
    unsigned int vfg_bitmap;
    struct dcmi_base_resource base;
    struct dcmi_computing_resource computing;
    struct dcmi_media_resource media;
};

struct dcmi_pcie_info_all {
    unsigned int venderid;
    unsigned int subvenderid;
    unsigned int deviceid;
    unsigned int subdeviceid;
    int domain;
    unsigned int bdf_busid;
    unsigned int bdf_deviceid;
    unsigned int bdf_funcid;
    unsigned char reserve[32];
};

struct chip {
    int card, dev, logic, phy;
    char type[MAX_CHIP_NAME_LEN], name[MAX_CHIP_NAME_LEN], ver[MAX_CHIP_NAME_LEN];
    unsigned int aicore;
    unsigned long long hbm_mb, mem_mb;
    unsigned int health;
    unsigned int errors[MAX_ERRORS];
    int error_count;
    int domain;
    unsigned int bus, device, function;
    char ip[64];
    char network[16]; /* the RoCE link check's result, or "-": not supported */
};

struct vdev {
    int card, dev;
    unsigned int id;
    char template_name[DCMI_VDEV_RES_NAME_LEN];
    unsigned int aicore;
    unsigned long long memory_mb;
    unsigned int vfg_id, status, in_container;
};

struct fail {
    char function[64];
    int code;
};

struct hang {
    char function[64];
    int card;
};

struct state {
    struct chip chips[MAX_CHIPS];
    int chip_count;
    struct fail fails[MAX_FAILS];
    int fail_count;
    struct hang hangs[MAX_HANGS];
    int hang_count;
    struct vdev vdevs[MAX_VDEVS];
    int vdev_count;
};

static int initialised;

static void parse_errors(struct chip *c, const char *text) {
    c->error_count = 0;
    if (strcmp(text, "-") == 0) return;
    char buf[512];
    strncpy(buf, text, sizeof(buf) - 1);
    buf[sizeof(buf) - 1] = '\0';
    for (char *tok = strtok(buf, ","); tok && c->error_count < MAX_ERRORS; tok = strtok(NULL, ",")) {
        c->errors[c->error_count++] = (unsigned int)strtoul(tok, NULL, 16);
    }
}

static void load_file(struct state *st, const char *path);

/* <state>.created: the vNPUs dcmi_create_vdevice made ("" when no state is named). */
static const char *created_path(void) {
    static __thread char path[4096];
    const char *state = getenv("ASCEND_DCMI_STATE");
    if (state == NULL) return "";
    snprintf(path, sizeof(path), "%s.created", state);
    return path;
}

static void load(struct state *st) {
    memset(st, 0, sizeof(*st));
    const char *path = getenv("ASCEND_DCMI_STATE");
    if (path == NULL) return;
    load_file(st, path);
    load_file(st, created_path());
}

static void load_file(struct state *st, const char *path) {
    FILE *f = fopen(path, "r");
    if (f == NULL) return;
    char line[1024];
    while (fgets(line, sizeof(line), f)) {
        if (strncmp(line, "chip ", 5) == 0 && st->chip_count < MAX_CHIPS) {
            struct chip *c = &st->chips[st->chip_count];
            char errors[512];
            int n = sscanf(line + 5,
                           "%d %d %d %d %31s %31s %31s %u %llu %llu %u %511s %d %u %u %u %63s %15s",
                           &c->card, &c->dev, &c->logic, &c->phy, c->type, c->name, c->ver,
                           &c->aicore, &c->hbm_mb, &c->mem_mb, &c->health, errors, &c->domain,
                           &c->bus, &c->device, &c->function, c->ip, c->network);
            if (n == 16) strcpy(c->ip, "-");
            if (n <= 17) strcpy(c->network, "-");
            if (n >= 16) {
                parse_errors(c, errors);
                st->chip_count++;
            }
        } else if (strncmp(line, "vdev ", 5) == 0 && st->vdev_count < MAX_VDEVS) {
            struct vdev *v = &st->vdevs[st->vdev_count];
            if (sscanf(line + 5, "%d %d %u %15s %u %llu %u %u %u", &v->card, &v->dev, &v->id,
                       v->template_name, &v->aicore, &v->memory_mb, &v->vfg_id, &v->status,
                       &v->in_container) == 9) st->vdev_count++;
        } else if (strncmp(line, "fail ", 5) == 0 && st->fail_count < MAX_FAILS) {
            struct fail *fl = &st->fails[st->fail_count];
            if (sscanf(line + 5, "%63s %d", fl->function, &fl->code) == 2) st->fail_count++;
        } else if (strncmp(line, "hang ", 5) == 0 && st->hang_count < MAX_HANGS) {
            struct hang *h = &st->hangs[st->hang_count];
            if (sscanf(line + 5, "%63s %d", h->function, &h->card) == 2) st->hang_count++;
        }
    }
    fclose(f);
}

/* The return code a test asked this function to fail with, or DCMI_OK. */
static int failing(const struct state *st, const char *function) {
    for (int i = 0; i < st->fail_count; i++) {
        if (strcmp(st->fails[i].function, function) == 0) return st->fails[i].code;
    }
    return DCMI_OK;
}

static int hanging(const struct state *st, const char *function, int card) {
    for (int i = 0; i < st->hang_count; i++) {
        if (strcmp(st->hangs[i].function, function) == 0 &&
            (st->hangs[i].card == -1 || st->hangs[i].card == card)) return 1;
    }
    return 0;
}

/* Block while the state says this call hangs (re-reading it), then carry on with it. */
static void hang_while_asked(struct state *st, const char *function, int card) {
    struct timespec pause = {0, HANG_POLL_NS};
    for (int polls = 0; polls < HANG_MAX_POLLS && hanging(st, function, card); polls++) {
        nanosleep(&pause, NULL);
        load(st);
    }
}

static const struct chip *find(const struct state *st, int card, int dev) {
    for (int i = 0; i < st->chip_count; i++) {
        if (st->chips[i].card == card && st->chips[i].dev == dev) return &st->chips[i];
    }
    return NULL;
}

/* Common preamble: load the state, hang if asked, check initialisation and any failure
 * asked for. The state is static: a hung call's stack stays small. */
#define BEGIN_CARD(st, name, card)                   \
    static __thread struct state st;                 \
    load(&st);                                       \
    hang_while_asked(&st, name, card);               \
    if (!initialised) return DCMI_ERR_CODE_NOT_REDAY; \
    do {                                             \
        int forced_ = failing(&st, name);            \
        if (forced_ != DCMI_OK) return forced_;      \
    } while (0)
#define BEGIN(st, name) BEGIN_CARD(st, name, -1)

#define CHIP_OR_FAIL(st, c, card, dev)                   \
    const struct chip *c = find(&st, card, dev);         \
    if (c == NULL) return DCMI_ERR_CODE_INVALID_DEVICE_ID

int dcmi_init(void) {
    static __thread struct state st;
    load(&st);
    hang_while_asked(&st, "dcmi_init", -1);
    int forced = failing(&st, "dcmi_init");
    if (forced != DCMI_OK) return forced;
    initialised = 1;
    return DCMI_OK;
}

int dcmi_get_card_list(int *card_num, int *card_list, int list_len) {
    BEGIN(st, "dcmi_get_card_list");
    if (card_num == NULL || card_list == NULL || list_len <= 0) return DCMI_ERR_CODE_INVALID_PARAMETER;
    int count = 0;
    for (int i = 0; i < st.chip_count; i++) {
        int seen = 0;
        for (int j = 0; j < count; j++) seen |= card_list[j] == st.chips[i].card;
        if (seen) continue;
        if (count >= list_len || count >= MAX_CARD_NUM) return DCMI_ERR_CODE_INVALID_PARAMETER;
        card_list[count++] = st.chips[i].card;
    }
    *card_num = count;
    return DCMI_OK;
}

int dcmi_get_device_num_in_card(int card_id, int *device_num) {
    BEGIN_CARD(st, "dcmi_get_device_num_in_card", card_id);
    if (device_num == NULL) return DCMI_ERR_CODE_INVALID_PARAMETER;
    int n = 0;
    for (int i = 0; i < st.chip_count; i++) n += st.chips[i].card == card_id;
    if (n == 0) return DCMI_ERR_CODE_INVALID_DEVICE_ID;
    *device_num = n;
    return DCMI_OK;
}

int dcmi_get_device_logic_id(int *device_logic_id, int card_id, int device_id) {
    BEGIN_CARD(st, "dcmi_get_device_logic_id", card_id);
    if (device_logic_id == NULL) return DCMI_ERR_CODE_INVALID_PARAMETER;
    CHIP_OR_FAIL(st, c, card_id, device_id);
    *device_logic_id = c->logic;
    return DCMI_OK;
}

int dcmi_get_device_phyid_from_logicid(unsigned int logicid, unsigned int *phyid) {
    BEGIN(st, "dcmi_get_device_phyid_from_logicid");
    if (phyid == NULL) return DCMI_ERR_CODE_INVALID_PARAMETER;
    for (int i = 0; i < st.chip_count; i++) {
        if ((unsigned int)st.chips[i].logic == logicid) {
            *phyid = (unsigned int)st.chips[i].phy;
            return DCMI_OK;
        }
    }
    return DCMI_ERR_CODE_INVALID_DEVICE_ID;
}

int dcmi_get_device_chip_info(int card_id, int device_id, struct dcmi_chip_info *chip_info) {
    BEGIN_CARD(st, "dcmi_get_device_chip_info", card_id);
    if (chip_info == NULL) return DCMI_ERR_CODE_INVALID_PARAMETER;
    CHIP_OR_FAIL(st, c, card_id, device_id);
    memset(chip_info, 0, sizeof(*chip_info));
    strncpy((char *)chip_info->chip_type, c->type, MAX_CHIP_NAME_LEN - 1);
    strncpy((char *)chip_info->chip_name, c->name, MAX_CHIP_NAME_LEN - 1);
    strncpy((char *)chip_info->chip_ver, c->ver, MAX_CHIP_NAME_LEN - 1);
    chip_info->aicore_cnt = c->aicore;
    return DCMI_OK;
}

int dcmi_get_device_health(int card_id, int device_id, unsigned int *health) {
    BEGIN_CARD(st, "dcmi_get_device_health", card_id);
    if (health == NULL) return DCMI_ERR_CODE_INVALID_PARAMETER;
    CHIP_OR_FAIL(st, c, card_id, device_id);
    *health = c->health;
    return DCMI_OK;
}

int dcmi_get_device_errorcode_v2(int card_id, int device_id, int *error_count,
                                 unsigned int *error_code_list, unsigned int list_len) {
    BEGIN_CARD(st, "dcmi_get_device_errorcode_v2", card_id);
    if (error_count == NULL || error_code_list == NULL) return DCMI_ERR_CODE_INVALID_PARAMETER;
    CHIP_OR_FAIL(st, c, card_id, device_id);
    int n = c->error_count < (int)list_len ? c->error_count : (int)list_len;
    for (int i = 0; i < n; i++) error_code_list[i] = c->errors[i];
    *error_count = n;
    return DCMI_OK;
}

int dcmi_get_device_hbm_info(int card_id, int device_id, struct dcmi_hbm_info *hbm_info) {
    BEGIN_CARD(st, "dcmi_get_device_hbm_info", card_id);
    if (hbm_info == NULL) return DCMI_ERR_CODE_INVALID_PARAMETER;
    CHIP_OR_FAIL(st, c, card_id, device_id);
    memset(hbm_info, 0, sizeof(*hbm_info));
    hbm_info->memory_size = c->hbm_mb;
    return DCMI_OK;
}

int dcmi_get_device_memory_info_v3(int card_id, int device_id,
                                   struct dcmi_get_memory_info_stru *memory_info) {
    BEGIN_CARD(st, "dcmi_get_device_memory_info_v3", card_id);
    if (memory_info == NULL) return DCMI_ERR_CODE_INVALID_PARAMETER;
    CHIP_OR_FAIL(st, c, card_id, device_id);
    memset(memory_info, 0, sizeof(*memory_info));
    memory_info->memory_size = c->mem_mb;
    memory_info->memory_available = c->mem_mb;
    return DCMI_OK;
}

int dcmi_get_device_pcie_info_v2(int card_id, int device_id, struct dcmi_pcie_info_all *pcie_info) {
    BEGIN_CARD(st, "dcmi_get_device_pcie_info_v2", card_id);
    if (pcie_info == NULL) return DCMI_ERR_CODE_INVALID_PARAMETER;
    CHIP_OR_FAIL(st, c, card_id, device_id);
    memset(pcie_info, 0, sizeof(*pcie_info));
    pcie_info->venderid = 0x19e5; /* Huawei's PCI vendor id */
    pcie_info->domain = c->domain;
    pcie_info->bdf_busid = c->bus;
    pcie_info->bdf_deviceid = c->device;
    pcie_info->bdf_funcid = c->function;
    return DCMI_OK;
}

int dcmi_get_device_ip(int card_id, int device_id, enum dcmi_port_type input_type, int port_id,
                       struct dcmi_ip_addr *ip, struct dcmi_ip_addr *mask) {
    BEGIN_CARD(st, "dcmi_get_device_ip", card_id);
    if (ip == NULL || mask == NULL || port_id != 0) return DCMI_ERR_CODE_INVALID_PARAMETER;
    CHIP_OR_FAIL(st, c, card_id, device_id);
    if (input_type != DCMI_ROCE_PORT || strcmp(c->ip, "-") == 0) return DCMI_ERR_CODE_NOT_SUPPORT;
    enum dcmi_ip_addr_type wanted = ip->ip_type;
    memset(ip, 0, sizeof(*ip));
    memset(mask, 0, sizeof(*mask));
    ip->ip_type = mask->ip_type = wanted;
    if (wanted == DCMI_IPADDR_TYPE_V4 && inet_pton(AF_INET, c->ip, ip->u_addr.ip4) == 1) {
        memset(mask->u_addr.ip4, 0xFF, 3); /* a /24 */
        return DCMI_OK;
    }
    if (wanted == DCMI_IPADDR_TYPE_V6 && inet_pton(AF_INET6, c->ip, ip->u_addr.ip6) == 1) {
        memset(mask->u_addr.ip6, 0xFF, 8); /* a /64 */
        return DCMI_OK;
    }
    return DCMI_ERR_CODE_NOT_SUPPORT;
}

int dcmi_get_device_network_health(int card_id, int device_id, enum dcmi_rdfx_detect_result *result) {
    BEGIN_CARD(st, "dcmi_get_device_network_health", card_id);
    if (result == NULL) return DCMI_ERR_CODE_INVALID_PARAMETER;
    CHIP_OR_FAIL(st, c, card_id, device_id);
    if (strcmp(c->network, "-") == 0) return DCMI_ERR_CODE_NOT_SUPPORT;
    *result = (enum dcmi_rdfx_detect_result)strtoul(c->network, NULL, 10);
    return DCMI_OK;
}

/* The vNPUs of a chip: DCMI_MAIN_CMD_VDEV_MNG's total resource (the vNPU ids and the chip's
 * AI cores and memory), one vNPU's resource (its template name, AI cores, memory, vGroup) and
 * what is left free. A chip with no vNPU answers a total of 0 vNPUs. */
int dcmi_get_device_info(int card_id, int device_id, int main_cmd, unsigned int sub_cmd,
                         void *buf, unsigned int *size) {
    BEGIN_CARD(st, "dcmi_get_device_info", card_id);
    if (buf == NULL || size == NULL) return DCMI_ERR_CODE_INVALID_PARAMETER;
    CHIP_OR_FAIL(st, c, card_id, device_id);
    if (main_cmd != DCMI_MAIN_CMD_VDEV_MNG) return DCMI_ERR_CODE_NOT_SUPPORT;
    unsigned int used_aic = 0;
    unsigned long long used_mem = 0;
    for (int i = 0; i < st.vdev_count; i++) {
        if (st.vdevs[i].card == card_id && st.vdevs[i].dev == device_id) {
            used_aic += st.vdevs[i].aicore;
            used_mem += st.vdevs[i].memory_mb;
        }
    }
    unsigned long long chip_mem = c->hbm_mb ? c->hbm_mb : c->mem_mb;
    if (sub_cmd == DCMI_VMNG_SUB_CMD_GET_TOTAL_RESOURCE) {
        struct dcmi_soc_total_resource *total = buf;
        if (*size < sizeof(*total)) return DCMI_ERR_CODE_INVALID_PARAMETER;
        memset(total, 0, sizeof(*total));
        for (int i = 0; i < st.vdev_count; i++) {
            const struct vdev *v = &st.vdevs[i];
            if (v->card != card_id || v->dev != device_id) continue;
            if (total->vdev_num >= DCMI_SOC_SPLIT_MAX) return DCMI_ERR_CODE_INNER_ERR;
            total->vdev_id[total->vdev_num++] = v->id;
            total->vfg_bitmap |= 1u << (v->vfg_id & 31u);
        }
        total->computing.aic = (float)c->aicore;
        total->computing.memory_size = chip_mem;
        *size = sizeof(*total);
        return DCMI_OK;
    }
    if (sub_cmd == DCMI_VMNG_SUB_CMD_GET_FREE_RESOURCE) {
        struct dcmi_soc_free_resource *free_ = buf;
        if (*size < sizeof(*free_)) return DCMI_ERR_CODE_INVALID_PARAMETER;
        memset(free_, 0, sizeof(*free_));
        free_->computing.aic = (float)(c->aicore > used_aic ? c->aicore - used_aic : 0);
        free_->computing.memory_size = chip_mem > used_mem ? chip_mem - used_mem : 0;
        *size = sizeof(*free_);
        return DCMI_OK;
    }
    if (sub_cmd == DCMI_VMNG_SUB_CMD_GET_VDEV_RESOURCE) {
        struct dcmi_vdev_query_stru *query = buf;
        if (*size < sizeof(*query)) return DCMI_ERR_CODE_INVALID_PARAMETER;
        for (int i = 0; i < st.vdev_count; i++) {
            const struct vdev *v = &st.vdevs[i];
            if (v->card != card_id || v->dev != device_id || v->id != query->vdev_id) continue;
            memset(&query->query_info, 0, sizeof(query->query_info));
            strncpy(query->query_info.name, v->template_name, DCMI_VDEV_RES_NAME_LEN - 1);
            query->query_info.status = v->status;
            query->query_info.is_container_used = v->in_container;
            query->query_info.vfg_id = v->vfg_id;
            query->query_info.base.vfg_id = v->vfg_id;
            query->query_info.computing.aic = (float)v->aicore;
            query->query_info.computing.memory_size = v->memory_mb;
            query->query_info.computing.vdev_memory_total = v->memory_mb;
            query->query_info.computing.vdev_memory_free = v->memory_mb;
            *size = sizeof(*query);
            return DCMI_OK;
        }
        return DCMI_ERR_CODE_INVALID_DEVICE_ID;
    }
    return DCMI_ERR_CODE_NOT_SUPPORT;
}

/* Virtual device creation and destruction, with dcmi_interface_api.h's structs. */
#define TEMPLATE_NAME_LEN 32
#define ANY_ID 0xFFFFFFFFu
#define FIRST_VDEV_ID 100u

struct dcmi_create_vdev_res_stru {
    unsigned int vdev_id;
    unsigned int vfg_id;
    char template_name[TEMPLATE_NAME_LEN];
    unsigned char reserved[64];
};

struct dcmi_create_vdev_out {
    unsigned int vdev_id;
    unsigned int pcie_bus;
    unsigned int pcie_device;
    unsigned int pcie_func;
    unsigned int vfg_id;
    unsigned char reserved[DCMI_VDEV_FOR_RESERVE];
};

static void node_path(char *out, size_t len, unsigned int id) {
    const char *dir = getenv("ASCEND_DCMI_DEV_DIR");
    snprintf(out, len, "%s/vdavinci%u", dir ? dir : "/dev", id);
}

/* The template's AI cores ("vir04" -> 4) and memory (its "_<n>g", else the chip's share). */
static int template_size(const struct chip *c, const char *name, unsigned int *aic,
                         unsigned long long *mem) {
    unsigned int cores = 0;
    if (sscanf(name, "vir%2u", &cores) != 1 || cores == 0 || c->aicore == 0) return 0;
    unsigned long long chip_mem = c->hbm_mb ? c->hbm_mb : c->mem_mb;
    const char *g = strstr(name, "g");
    unsigned int gib = 0;
    const char *us = strrchr(name, '_');
    if (g != NULL && us != NULL && sscanf(us + 1, "%ug", &gib) == 1 && gib > 0) {
        *mem = (unsigned long long)gib * 1024ULL;
    } else {
        *mem = chip_mem * cores / c->aicore;
    }
    *aic = cores;
    return 1;
}

/* Makes the vNPU from the template (ids chosen when ANY_ID is asked, as the driver does):
 * refused when the chip has not enough AI cores or memory left. */
int dcmi_create_vdevice(int card_id, int device_id, struct dcmi_create_vdev_res_stru *vdev,
                        struct dcmi_create_vdev_out *out) {
    BEGIN_CARD(st, "dcmi_create_vdevice", card_id);
    if (vdev == NULL || out == NULL) return DCMI_ERR_CODE_INVALID_PARAMETER;
    CHIP_OR_FAIL(st, c, card_id, device_id);
    char name[TEMPLATE_NAME_LEN];
    memcpy(name, vdev->template_name, sizeof(name));
    name[sizeof(name) - 1] = '\0';
    unsigned int aic = 0;
    unsigned long long mem = 0;
    if (!template_size(c, name, &aic, &mem) || strlen(name) >= DCMI_VDEV_RES_NAME_LEN)
        return DCMI_ERR_CODE_INVALID_PARAMETER;
    unsigned int used_aic = 0;
    unsigned long long used_mem = 0;
    unsigned int id = vdev->vdev_id == ANY_ID ? FIRST_VDEV_ID : vdev->vdev_id;
    for (int again = 1; again;) {
        again = 0;
        for (int i = 0; i < st.vdev_count; i++) {
            if (st.vdevs[i].id == id) {
                if (vdev->vdev_id != ANY_ID) return DCMI_ERR_CODE_INNER_ERR;
                id++;
                again = 1;
            }
        }
    }
    for (int i = 0; i < st.vdev_count; i++) {
        if (st.vdevs[i].card == card_id && st.vdevs[i].dev == device_id) {
            used_aic += st.vdevs[i].aicore;
            used_mem += st.vdevs[i].memory_mb;
        }
    }
    unsigned long long chip_mem = c->hbm_mb ? c->hbm_mb : c->mem_mb;
    if (used_aic + aic > c->aicore || used_mem + mem > chip_mem) return DCMI_ERR_CODE_INNER_ERR;
    unsigned int vfg = vdev->vfg_id == ANY_ID ? id - FIRST_VDEV_ID : vdev->vfg_id;
    FILE *f = fopen(created_path(), "a");
    if (f == NULL) return DCMI_ERR_CODE_INNER_ERR;
    fprintf(f, "vdev %d %d %u %s %u %llu %u 0 0\n", card_id, device_id, id, name, aic, mem, vfg);
    fclose(f);
    char node[4200];
    node_path(node, sizeof(node), id);
    FILE *n = fopen(node, "w");
    if (n != NULL) fclose(n);
    memset(out, 0, sizeof(*out));
    out->vdev_id = id;
    out->vfg_id = vfg;
    out->pcie_bus = c->bus;
    out->pcie_device = c->device;
    out->pcie_func = c->function;
    return DCMI_OK;
}

/* Destroys a vNPU dcmi_create_vdevice made (its line and its node). */
int dcmi_set_destroy_vdevice(int card_id, int device_id, unsigned int vdevid) {
    BEGIN_CARD(st, "dcmi_set_destroy_vdevice", card_id);
    CHIP_OR_FAIL(st, c, card_id, device_id);
    (void)c;
    const char *path = created_path();
    FILE *f = fopen(path, "r");
    if (f == NULL) return DCMI_ERR_CODE_INVALID_DEVICE_ID;
    char kept[MAX_VDEVS][256];
    int count = 0, found = 0;
    char line[256];
    while (fgets(line, sizeof(line), f) && count < MAX_VDEVS) {
        int card, dev;
        unsigned int id;
        if (sscanf(line, "vdev %d %d %u", &card, &dev, &id) == 3 && card == card_id &&
            dev == device_id && id == vdevid) {
            found = 1;
            continue;
        }
        strcpy(kept[count++], line);
    }
    fclose(f);
    if (!found) return DCMI_ERR_CODE_INVALID_DEVICE_ID;
    char temporary[4200];
    snprintf(temporary, sizeof(temporary), "%s.tmp", path);
    FILE *w = fopen(temporary, "w");
    if (w == NULL) return DCMI_ERR_CODE_INNER_ERR;
    for (int i = 0; i < count; i++) fputs(kept[i], w);
    fclose(w);
    if (rename(temporary, path) != 0) return DCMI_ERR_CODE_INNER_ERR;
    char node[4200];
    node_path(node, sizeof(node), vdevid);
    remove(node);
    return DCMI_OK;
}
